"""Accuracy of the predictor on the published runs, in-sample and leave-one-source-out.

Target: in-sample MAPE of tokens/s per GPU <= 15 %; the held-out (leave-one-source-out) figure is
the headline. `scalelab validate --json` and `--cross-validate --json` must each take under 10 s.

Run: `PYTHONPATH=src python benchmarks/validate_accuracy.py`. The same numbers as
`scalelab validate --cross-validate`, plus the wall and CPU time of each mode.
"""

from __future__ import annotations

import os
import resource
import time

from scalelab.validate import run_validation


def _timed(cross: bool) -> tuple[object, float, float]:
    cpu0 = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    t0 = time.perf_counter()
    report = run_validation(with_cross_validation=cross)
    return (
        report,
        time.perf_counter() - t0,
        resource.getrusage(resource.RUSAGE_SELF).ru_utime - cpu0,
    )


def main() -> None:
    _, wall_in, cpu_in = _timed(False)
    r, wall_cv, cpu_cv = _timed(True)
    cv = r.cross_validated or {}
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(
        f"validate: {wall_in:.2f} s wall ({cpu_in:.2f} s CPU); --cross-validate: {wall_cv:.2f} s wall ({cpu_cv:.2f} s CPU)"
    )
    print(f"rows used {r.rows_used}, skipped {r.rows_skipped} {r.skipped_by_reason}")
    print(
        f"in-sample MAPE {r.mape_tokens_per_gpu * 100:.1f} %, within ±20 % {r.within_20_pct * 100:.0f} %, "
        f"median Spearman {r.median_spearman:+.2f} over {r.sweeps} sweeps"
    )
    print(
        f"held-out MAPE {cv['mape_tokens_per_gpu'] * 100:.1f} % (source-balanced "
        f"{cv['mape_source_balanced'] * 100:.1f} %), within ±20 % {cv['within_20_pct'] * 100:.0f} %, "
        f"median Spearman {cv['spearman_median']:+.2f}"
    )
    print(
        "| source | runs | in-sample MAPE | bias | held-out MAPE | bias | held-out parameters from |"
    )
    for source, stats in r.by_source.items():
        held = cv["by_source"][source]
        how = "; ".join(f"{k}: {v}" for k, v in held["clusters"].items())
        print(
            f"| {source} | {stats['rows']} | {stats['mape'] * 100:.1f} % | {stats['bias'] * 100:+.1f} % | "
            f"{held['mape'] * 100:.1f} % | {held['bias'] * 100:+.1f} % | {how} |"
        )
    m = r.memory
    print(
        f"memory: {m['predicted_not_to_fit']} of {r.rows_used} predicted not to fit {m['predicted_not_to_fit_by_source']}; "
        f"predicted/measured peak over {m['runs_with_measured_peak']} runs: median {m['ratio_median']:.2f}, "
        f"10-90 % {m['ratio_p10']:.2f}-{m['ratio_p90']:.2f}, range {m['ratio_min']:.2f}-{m['ratio_max']:.2f}"
    )
    print(f"runs relying on an assumed value, by field: {r.assumed_fields}")


if __name__ == "__main__":
    main()
