"""Issue 21 §1: BP, DFA and the frozen baseline on the reference model, diagnosed with early stop.

Prints, for each seed, the protocol's table (`minitrain_inspect.protocol.protocol_table`) and the figures behind it.
Usage: python benchmarks/protocol_gallery.py [--steps 2000] [--every 50] [--seeds 0 1 2]
"""
import argparse
import json
import platform
import time

from minitrain_inspect.protocol import protocol_gallery, protocol_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--json", help="also write every row (without its reports) to this file")
    args = parser.parse_args()
    print(f"steps {args.steps}, diagnosis every {args.every}, seeds {args.seeds}, 1 BLAS thread, "
          f"{platform.machine()} {platform.processor() or ''}".strip())
    every_row = []
    for seed in args.seeds:
        start = time.perf_counter()
        rows = protocol_gallery(steps=args.steps, every=args.every, seed=seed)
        print(f"\nseed {seed} (frozen baseline {rows[0]['frozen_baseline_acc']:.3f}; "
              f"{time.perf_counter() - start:.0f} s)\n")
        print(protocol_table(rows))
        every_row += [{**{k: v for k, v in r.items() if k != "reports"}, "seed": seed} for r in rows]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(every_row, f, indent=1)


if __name__ == "__main__":
    main()
