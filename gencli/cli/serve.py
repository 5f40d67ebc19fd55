"""gencli serve: recommendations over HTTP from a bundle, batched, hot-swapped when --bundle moves."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from gencli.cli.common import config, fail
from gencli.cli.options import config_options

EXTRA = "pip install 'gencli[serve]'"


def _options(f):
    from gencli.config import ServeConfig

    f = config_options(ServeConfig)(f)
    return click.option("--bundle", required=True, type=click.Path(path_type=Path),
                        help="The bundle to serve: a folder written by `gencli export`, or the link or pointer file "
                             "`gencli run --promote` moves (watched: a new bundle is loaded and switched in).")(f)


@click.command("serve")
@_options
def serve(bundle, **options):
    """Answer recommendations over HTTP from a bundle (docs/serving.md): POST /v1/recommend, /v1/recommend/batch.

    Concurrent requests are decoded together; when --bundle moves (checked every --watch seconds, and on
    SIGHUP) the new bundle is loaded beside the old one and switched in without failing a request; a bundle
    that fails to load leaves the old one serving. SIGTERM answers the requests in flight and exits 0. Needs
    the serve extra (pip install 'gencli[serve]').

    \b
    Examples:
      gencli --threads 1 serve --bundle current
      gencli serve --bundle ./shop-model --port 0 --watch 0
    """
    from gencli.config import ServeConfig
    from gencli.config.serving import API_KEY_ENV

    source = click.get_current_context().get_parameter_source("api_key")
    given = (options.get("api_key") or "").strip()
    empty_env = API_KEY_ENV in os.environ and not os.environ[API_KEY_ENV].strip() and not given
    if empty_env or (source == click.core.ParameterSource.COMMANDLINE and not given):
        from gencli.errors import InputError

        where = f"{API_KEY_ENV} is set but empty" if empty_env else "--api-key is empty"
        fail(InputError(f"{where}: the server would answer everyone without a token; set the key, or unset "
                        f"{API_KEY_ENV} (and leave out --api-key) to serve without one"), False)
    cfg = config(ServeConfig, False, options)
    missing = [name for name in ("uvicorn", "starlette") if not _importable(name)]
    if missing:
        from gencli.errors import InputError

        fail(InputError(f"gencli serve needs {' and '.join(missing)}, which are not installed: {EXTRA}"), False)
    import logging

    from gencli.threads import QUERY_THREADS
    from gencli.workspace.executor import apply_threads, quiet_libraries

    quiet_libraries()
    apply_threads(QUERY_THREADS)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s gencli serve: %(message)s")
    try:
        from gencli.server.service import Service

        service = Service(cfg, bundle)
    except Exception as error:  # noqa: BLE001 - a bad bundle or a busy port: one message, exit 2
        fail(error, False)
    click.echo(f"gencli serve: listening on {service.url} (bundle {service.holder.current.path}, model "
               f"{service.holder.current.model_id}); {service.access.describe()}", err=True)
    code = service.serve()
    if service.abandoned_load:  # a daemon thread is inside torch: interpreter shutdown would abort (SIGABRT)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True
