"""``kvclaims dashboard`` and ``kvclaims report``: the audit for people, in a browser or as
one HTML file. Registered by ``kvclaims.cli``; nothing here imports Streamlit until the
dashboard starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kvclaims.contract.schema import InputError
from kvclaims.dashboard.report import write_report
from kvclaims.progress import Progress

APP = Path(__file__).resolve().parent / "app.py"
LOCAL = "127.0.0.1"
# Host headers the dashboard answers by default (its websocket refuses any other): a page on
# another name that resolves to this machine (DNS rebinding) cannot reach the audit.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``dashboard`` and ``report``."""
    d = sub.add_parser(
        "dashboard", help="serve the audit dashboard (Streamlit) on 127.0.0.1",
        description="Serve the audit dashboard for run or sweep directories (default: the "
                    "shipped traces). It listens on 127.0.0.1 only unless --host says "
                    "otherwise, browses only under the directories given here, and answers "
                    "GET /_stcore/health when up.")
    d.add_argument("paths", nargs="*", metavar="PATH", help="run or sweep directories")
    d.add_argument("--whatif", action="append", default=[], metavar="DIR",
                   help="a computed what-if (kvclaims whatif --out DIR, or one of its run "
                        "directories; repeatable): shown on the What-if page beside its "
                        "recorded run and cited in tenant explanations. Replays among PATH "
                        "are found too")
    d.add_argument("--port", type=_port, default=8501, help="TCP port (default 8501)")
    d.add_argument("--host", default=LOCAL,
                   help="address to listen on (default 127.0.0.1; anything else exposes the "
                        "unauthenticated dashboard to that network)")
    d.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="also accept this name in the browser's Host header (repeatable; "
                        "default: localhost, 127.0.0.1, ::1 and --host). Every other Host "
                        "is refused (DNS rebinding)")
    d.set_defaults(func=_dashboard)

    r = sub.add_parser(
        "report", help="write a self-contained HTML incident report",
        description="Write one self-contained HTML page (charts embedded, nothing fetched when "
                    "opened) with the headline, the timeline, the claims, the computed "
                    "what-ifs, the findings and the conformance verdicts of the given run or "
                    "sweep directories.")
    r.add_argument("paths", nargs="+", metavar="RUN_DIR", help="run or sweep directories")
    r.add_argument("--out", required=True, type=Path, help="HTML file to write")
    r.add_argument("--whatif", action="append", default=[], metavar="DIR",
                   help="a computed what-if (kvclaims whatif --out DIR, or one of its run "
                        "directories; repeatable): shown beside its recorded run and cited "
                        "in the tenant explanations. Replays among RUN_DIR are found too")
    r.add_argument("--quiet", action="store_true", help="no progress on stderr")
    r.set_defaults(func=_report)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range 1-65535: {port}")
    return port


def allowed_hosts(host: str, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The Host header names the dashboard's websocket accepts: loopback names, the address
    it listens on (unless every interface), and ``extra``; never ``*``."""
    names = list(LOOPBACK_NAMES)
    for name in [host, *extra]:
        name = name.strip().lower().strip("[]")
        if name and name not in ("0.0.0.0", "::", "*") and name not in names:
            names.append(name)
    return names


def streamlit_command(paths: list[str], port: int, host: str,
                      extra_hosts: list[str] | tuple[str, ...] = (),
                      whatif: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The ``streamlit run`` command line the dashboard is served with.

    NOTE: the safety settings are flags, not only ``.streamlit/config.toml`` (read from the
    working directory), so they hold wherever ``kvclaims dashboard`` is started. The
    websocket checks the Host header against ``allowed_hosts`` and the Origin against the
    Host (Streamlit's CORS and XSRF protection stay on).
    """
    hosts = [a for name in allowed_hosts(host, extra_hosts)
             for a in ("--server.allowedHosts", name)]
    return [sys.executable, "-m", "streamlit", "run", str(APP),
            "--server.address", host, "--server.port", str(port),
            "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--client.showErrorDetails", "none", "--client.toolbarMode", "viewer",
            "--server.enableCORS", "true", "--server.enableXsrfProtection", "true",
            *hosts, "--", *paths, *(f"--whatif={w}" for w in whatif)]


def _dashboard(args: argparse.Namespace) -> int:
    for p in [*args.paths, *args.whatif]:
        if not Path(p).is_dir():
            raise InputError(f"{p}: no such directory")
    if args.host != LOCAL:
        print(f"kvclaims dashboard: warning: listening on {args.host}: anyone who can reach "
              "it can read these traces (no authentication)", file=sys.stderr)
    print(f"kvclaims dashboard: http://{args.host}:{args.port}/ (Ctrl-C to stop)",
          file=sys.stderr)
    env = dict(os.environ)
    if any(h.strip() in ("*", "") for h in args.allowed_host):
        raise InputError("--allowed-host needs a host name ('*' would accept any page that "
                         "resolves to this machine)")
    command = streamlit_command(list(args.paths), args.port, args.host, args.allowed_host,
                                args.whatif)
    # NOTE: the server replaces this process (exec), it is not its child: a SIGTERM sent to
    # `kvclaims dashboard` (a service manager, a test) then stops the server itself instead
    # of leaving it running, orphaned
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(command[0], command, env)
    except OSError as exc:
        raise InputError(f"cannot start the dashboard server: {exc.strerror or exc}") from None
    return 0  # NOTE: not reached: execve returns only by raising


def _report(args: argparse.Namespace) -> int:

    if args.out.is_dir():
        raise InputError(f"{args.out}: is a directory; name the HTML file to write")
    with Progress("report", quiet=args.quiet, key="report") as progress:
        try:
            write_report(args.paths, str(args.out), progress=progress.stage,
                         whatif=args.whatif)
        except OSError as exc:  # an unwritable --out is bad input, one line
            raise InputError(f"{args.out}: cannot write: {exc.strerror or exc}") from None
    print(args.out)
    return 0
