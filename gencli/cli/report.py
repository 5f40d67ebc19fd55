"""gencli report: one self-contained HTML page of a workdir (or of a season of nights), from its own files."""

from __future__ import annotations

from pathlib import Path

import click

from gencli.cli.common import JSON_OPTION, fail, require, resolve_workdir, workdir_option

MAX_BYTES = 5 * 1024 * 1024  # what a mail attachment carries; the page is far below it


@click.command("report")
@click.argument("dirs", nargs=-1, metavar="[DIR]...", type=click.Path(path_type=Path))
@workdir_option
@click.option("--output", "-o", type=click.Path(path_type=Path), default=Path("report.html"),
              show_default=True, help="The HTML file to write (replaced when it exists), or '-' for stdout.")
@click.option("--nights", is_flag=True,
              help="Compare the nights the DIRs name instead: each a night's workdir (followed back along its "
                   "--previous chain) or a --promote link (every night its promotions.jsonl judged).")
@click.option("--threshold", type=float, default=0.05, show_default=True,
              help="With --nights: flag a night whose key metric fell more than this share below the last promoted "
                   "night's.")
@JSON_OPTION
def report(dirs, workdir, output, nights, threshold, json_mode):
    """Write one HTML file (charts and styles inline, nothing fetched) of a run, or of nights side by side.

    Status, training curves (loss, learning rate, tokens/s, validations, the kept checkpoint and why training
    stopped), eval and cold-eval under both seen-item policies, the blend's shares, probe's pictures and a few
    users' recommendations; nothing is trained or decoded again. With --nights, the key metrics across nights with
    each promotion decision and its reason.

    \b
    Examples:
      gencli report --workdir runs/2026-06-01 --output report.html
      gencli report --nights current --output season.html
      gencli report --nights runs/2026-06-01 runs/2026-06-02 --threshold 0.1
    """
    from gencli.fileio import write_text_atomic
    from gencli.ui import report as page
    from gencli.ui.output import emit_json

    require(nights == bool(dirs), "DIR arguments go with --nights (gencli report --nights DIR...), and --nights "
                                  "needs at least one DIR: a night's workdir or the --promote link", json_mode)
    stdout = str(output) == "-"
    require(not (stdout and json_mode), "--output - writes the page to stdout, where --json writes its result: "
                                        "give --output a file, or leave out --json", json_mode)
    try:
        if not stdout:
            from gencli.workspace.places import check_output

            check_output(output)  # before anything is read: the page lands in no workdir and no bundle
        if nights:
            from gencli.flow.nights import read_nights

            data = read_nights(list(dirs), threshold)
            text = page.render_nights(data)
        else:
            from gencli.flow.report import read_report

            data = read_report(resolve_workdir(workdir))
            text = page.render(data)
        if stdout:
            click.echo(text, nl=False)
        else:
            write_text_atomic(output, text)
    except Exception as error:  # noqa: BLE001 - every failure becomes one clear message + exit code
        fail(error, json_mode, None if stdout else output)
    if stdout:
        page.print_problems(data["problems"])
        return
    size = output.stat().st_size
    shown = {"status": "done", "output": str(output), "bytes": size,
             "problems": data["problems"], **({"nights": len(data["nights"])} if nights else {})}
    if json_mode:
        emit_json(shown)
    else:
        page.print_written(output, size, data["problems"])
