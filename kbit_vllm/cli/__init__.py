"""The kbit-vllm command line: one module per subcommand, each with add_parser() and run()."""

from __future__ import annotations

import argparse
import sys

from . import bench, demo, info, quantize, roundtrip

SUBCOMMANDS = (demo, quantize, bench, info, roundtrip)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kbit-vllm", description="kbit / awq_orin weight-only quantization for vLLM "
                                "and Hugging Face: quantize a model, run the demo, benchmark the kernels.")
    sub = p.add_subparsers(dest="cmd", required=True)
    for mod in SUBCOMMANDS:
        mod.add_parser(sub).set_defaults(fn=mod.run)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
