"""`tuner export OUTPUT_DIR | --storage URL --study NAME [-o config.pbtxt | model.json]`."""

from __future__ import annotations

import argparse

from tuner.cli._args import add_command, add_flag, add_output_file, add_storage, add_tune_output
from tuner.errors import SettingsError
from tuner.files import check_writable


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tuner export` to `subparsers`."""
    parser = add_command(
        subparsers,
        "export",
        run=run,
        help="write the recommended config.pbtxt (a vLLM-backend model's model.json) of a finished study",
        description="Write the recommended config.pbtxt (the study's base config with only the tuned "
        "fields changed, under a comment header), or for a model vLLM serves its model.json (its engine "
        "arguments with only the tuned knobs changed; JSON holds no comment, so a file there is replaced "
        "only where it holds the same text, or with --force), from a `tuner tune` output directory or "
        "from any Optuna storage holding a study made by `tuner tune`. Exit 3 if no configuration met the SLA.",
    )
    add_tune_output(parser, "a `tuner tune` output directory", optional=True)
    add_storage(parser, "an Optuna storage URL or journal file")
    parser.add_argument("--study", metavar="NAME", help="the study's name (needed if the storage holds several)")
    add_output_file(parser, metavar="FILE",
                    help="where to write (default: OUTPUT_DIR/recommended/config.pbtxt, a vLLM-backend "
                    "model's OUTPUT_DIR/recommended/model.json, or stdout with --storage); a file already "
                    "there that tuner did not write is refused unless --force")
    add_flag(parser, "--force", "replace the -o file even where tuner did not write it (your own config)")


def run(args: argparse.Namespace) -> int:
    """Write (or, from a storage without -o, print) a finished study's recommended config.pbtxt; exit 0."""
    from tuner import export

    if bool(args.output_dir) == bool(args.storage):
        raise SettingsError("give either OUTPUT_DIR or --storage URL (not both)")
    if args.output_dir:
        storage, name = export.storage_of(args.output_dir)
        target = args.output or str(export.recommended_path(args.output_dir))
    else:
        storage, name, target = args.storage, args.study, args.output
    if target is None:
        study = export.load_study(storage, args.study or name)
        print(export.recommended_text(study, export.summarize(study)), end="")
        return 0
    if args.output:  # a file the person names goes into a directory that is there (files.check_writable);
        check_writable(args.output, label=f"-o {args.output}")  # the default's, tuner's own, is made
    # the default path is tuner's own output; a file the user named may be their config
    path = export.export(storage, args.study or name, target, force=args.force or not args.output)
    print(f"wrote {path}")
    return 0
