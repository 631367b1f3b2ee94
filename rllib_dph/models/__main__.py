"""Builds a bundled model: ``python -m rllib_dph.models build tiny-sql-math|smollm2-135m-instruct [--out DIR]``.

Without ``--out`` the model goes to the cache directory that ``resolve_model`` uses
(``$RLLIB_DPH_HOME/models/<name>``). Prints the directory, the build time and the measured
base-policy metrics.
"""

import argparse
import sys

from rllib_dph.files import home
from rllib_dph.models.hub import BUNDLED_MODELS, build_model, model_fingerprint
from rllib_dph.models.tiny import BUILD_THREADS, format_record


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rllib_dph.models", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build a bundled model offline (a tiny model, or the smollm2 conversion)")
    build.add_argument("name", choices=BUNDLED_MODELS)
    build.add_argument("--out", help="output directory (default: $RLLIB_DPH_HOME/models/<name>)")
    build.add_argument("--force", action="store_true", help="rebuild even if the directory holds a build")
    build.add_argument(
        "--threads", type=int, default=BUILD_THREADS, help=f"torch threads (default {BUILD_THREADS})"
    )
    build.add_argument("--no-progress", action="store_true", help="hide progress bars")
    args = parser.parse_args(argv)

    out = args.out or home() / "models" / args.name
    record = build_model(
        args.name, out, force=args.force, num_threads=args.threads, progress=not args.no_progress
    )
    print(format_record(record))
    print(f"saved to {out} (fingerprint {model_fingerprint(str(out))})")


if __name__ == "__main__":
    main(sys.argv[1:])
