"""gencli profile: real sft training steps per STAMP variant (base, sap, map, stamp), timed and measured."""

from __future__ import annotations

import click

from gencli.cli.common import config, run_step, step_options
from gencli.cli.options import config_options


@click.command()
@config_options("profile")
@step_options
def profile(workdir, json_mode, force, **options):
    """Tokens/s, step time (data/forward/backward/optimizer) and peak memory of sft training per STAMP variant.

    Uses sft's settings (its step.json params when sft has run, else the sft defaults).

    \b
    Examples:
      gencli profile
      gencli profile --variants base,stamp --steps 20 --detail
    """
    metrics = run_step("profile", config("profile", json_mode, options), workdir, json_mode, force)
    if not json_mode and metrics:
        _print_table(metrics)


def _print_table(metrics: dict) -> None:
    """Two narrow tables (time, memory) so they fit an 80-column terminal; top operators with --detail."""
    from rich.table import Table

    from gencli.ui.output import _fmt, console

    def cell(row: dict, key: str) -> str:
        value = row.get(key)
        if value is None:
            return ""
        if key.endswith("reduction"):  # shown as the change: more memory than the reference is "+34%"
            return f"{-100 * value:+.0f}%"
        return f"{value:.2f}x" if key == "speedup" else _fmt(value)

    header = (f"{metrics['steps']} steps x batch {metrics['batch_size']} on {metrics['device']}, "
              f"~{metrics['mean_tokens_per_sample']} tokens/sample, vs {metrics['reference']}")
    layouts = [
        (f"profile time ({header})", [("variant", "variant"), ("tokens/s", "tokens_per_s"), ("speedup", "speedup"),
                                      ("step s", "step_s"), ("data s", "data_s"), ("fwd s", "forward_s"),
                                      ("bwd s", "backward_s"), ("optim s", "optimizer_s")]),
        ("profile memory", [("variant", "variant"), ("peak MB", "peak_mem_mb"), ("peak vs ref", "mem_reduction"),
                            ("activations MB", "activation_mb"), ("activ. vs ref", "activation_reduction"),
                            ("loss", "loss")]),
    ]
    out = console()
    for title, columns in layouts:
        table = Table(title=title)
        for name, _ in columns:
            table.add_column(name, justify="left" if name == "variant" else "right")
        for row in metrics["variants"]:
            table.add_row(*(cell(row, key) for _, key in columns))
        out.print(table)
    for row in metrics["variants"]:
        if row.get("top_ops"):
            ops = Table(title=f"top operators, one step of {row['variant']}")
            for col in ("op", "self ms", "calls"):
                ops.add_column(col, justify="left" if col == "op" else "right")
            for op in row["top_ops"]:
                ops.add_row(op["op"], _fmt(op["self_ms"]), _fmt(op["calls"]))
            out.print(ops)
