"""Accuracy of the predictor on the published runs (target: MAPE of tokens/s per GPU <= 15 %).

Run: `python benchmarks/validate_accuracy.py`. The same numbers as `scalelab validate`.
"""

from __future__ import annotations

from scalelab.validate import run_validation


def main() -> None:
    r = run_validation()
    print(f"rows used {r.rows_used}, skipped {r.rows_skipped} {r.skipped_by_reason}")
    print(
        f"MAPE tokens/s per GPU: {r.mape_tokens_per_gpu * 100:.1f} %; within ±20 %: {r.within_20_pct * 100:.0f} %; "
        f"median Spearman within sweeps: {r.median_spearman:+.2f}; predicted not to fit: {r.rows_predicted_not_to_fit}"
    )
    for source, stats in r.by_source.items():
        print(
            f"  {source:40s} rows {stats['rows']:4d}  MAPE {stats['mape'] * 100:5.1f} %  median bias {stats['bias'] * 100:+5.1f} %"
        )


if __name__ == "__main__":
    main()
