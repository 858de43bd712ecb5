"""`oars serve`, `oars pull`, `oars models`, `oars check`, `oars validate`: the parser and the
subcommands (`oars serve`'s flags come from `oars.settings`, its body is `oars.serve`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from oars.errors import OarsError
from oars.settings import add_flags, from_args


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oars", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_flags(sub.add_parser("serve", help="serve the Responses API"))
    pull = sub.add_parser("pull", help="download and verify a model into the cache")
    pull.add_argument(
        "ref",
        nargs="?",
        default=None,
        help="a GGUF URL or hf://OWNER/REPO/FILE.gguf, or 'default' (the default model), or "
        "'embedding' (the default embedding model); none: both default models",
    )
    pull.add_argument("--sha256", default=None, help="the file's expected sha256")
    pull.add_argument("--quiet", action="store_true", help="no progress bar")
    sub.add_parser("models", help="list the models in the cache")
    check = sub.add_parser("check", help="run the protocol battery against any Responses server")
    check.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8000/v1")
    check.add_argument("--model", required=True)
    check.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "unused"))
    check.add_argument("--json", action="store_true", help="print results as JSON")
    check.add_argument("--only", default="", help="comma-separated check names")
    check.add_argument("--max-tokens", type=int, default=48, help="max_output_tokens per request")
    validate = sub.add_parser("validate", help="check a saved SSE stream against the protocol")
    validate.add_argument("file", type=Path, help="the stream, as sent on the wire ('-' = stdin)")
    return parser


def _pull(args: argparse.Namespace) -> None:
    from oars.download import pull_url, source
    from oars.weights import DEFAULT_EMBEDDING, pull, pull_embedding

    embedding = ("embedding", DEFAULT_EMBEDDING.name)
    if args.ref in (None, "default"):
        print(pull(quiet=args.quiet))
    if args.ref is None or args.ref in embedding:
        print(pull_embedding(quiet=args.quiet))
    if args.ref not in (None, "default", *embedding):
        print(pull_url(source(args.ref, args.sha256), quiet=args.quiet))


def _models() -> None:
    from oars.download import cached

    models = cached()
    if not models:
        print("no models in the cache (`oars pull` fetches the default one)")
    for model in models:
        print(f"{model.name:<48} {model.size / 2**20:>9.1f} MiB  {model.path}")


def _check(args: argparse.Namespace) -> int:
    import dataclasses

    import httpx

    from oars.check import Checker, table

    headers = {"Authorization": f"Bearer {args.api_key}"}
    with httpx.Client(headers=headers) as client:
        checker = Checker(client, args.url, args.model, max_tokens=args.max_tokens)
        results = checker.run({n for n in args.only.split(",") if n} or None)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in results], indent=2))
    else:
        print(table(results))
    return 1 if any(r.status == "failed" for r in results) else 0


def _validate(args: argparse.Namespace) -> int:
    from oars.validator import validate_sse

    text = sys.stdin.read() if str(args.file) == "-" else args.file.read_text()
    report = validate_sse(text)
    print(
        json.dumps(
            {"ok": report.ok, "violations": [v.describe() for v in report.violations]}, indent=2
        )
    )
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            from oars import serve

            return serve.main(from_args(args, os.environ))
        if args.command == "pull":
            _pull(args)
        elif args.command == "models":
            _models()
        elif args.command == "validate":
            return _validate(args)
        elif args.command == "check":
            return _check(args)
    except OarsError as exc:
        print(f"oars: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
