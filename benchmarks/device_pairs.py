"""Device pairs (issue 37, item 3): real GPU re-runs judged against CPU envelopes.

Two halves, so the device time is spent only on training:

``record`` (on the GPU machine): the calibration families of ``tests/numeric_runs.py``
(the bundled example's CNN, a Transformer layer, a GRU; dropout 0, since a GPU's dropout
masks come from the CUDA generator and are a real difference, not rounding) trained on the
device at each precision: ``fp32`` (TF32 off in matmuls and cuDNN), ``tf32`` (TF32 on in
both) and ``bf16`` (autocast around the forward and the loss). Per family and precision:
the run, the same run again (is the device deterministic?), one-ULP runs (the envelope a
device would measure on itself) and the planted changes, made on the device. The run
again is kept to show the device repeats itself, and not counted twice. Every trail
goes into one JSON file, written after each family (a cut-off run keeps what it did).

``judge`` (on CPU, here): the same families' float32 CPU run is the recorded run. Each
device trail at precision P is judged as ``verify`` judges a re-run: at fp32 against the
CPU's one-ULP envelope, at tf32/bf16 against the CPU's emulated envelope at P, measured
from the run's emulated twin (``numeric.twin``), as ``capture --precision P`` makes it.
Honest device re-runs must be ``equivalent`` (false ``differs`` counted), planted changes
``differs`` (false ``equivalent`` counted). Also the other direction: the device's own
one-ULP envelope (``how: measured``) judging the CPU's emulated re-run and its planted
changes, and two devices' files against each other (H100 ↔ H200).

    python benchmarks/device_pairs.py record --out pairs-h200.json     # on the GPU
    python benchmarks/device_pairs.py record --device cpu --out x.json  # the CPU twin
    python benchmarks/device_pairs.py judge benchmarks/data/pairs-h200.json.gz
    python benchmarks/device_pairs.py judge --stochastic benchmarks/data/pairs-h200.json.gz

``benchmarks/data/pairs-h200.json.gz`` is the file an H200 recorded (torch 2.11+cu130,
issue 37); an H100 recorded the same 126 trails bit for bit. ``--stochastic``: the TF32 and
bf16 envelope runs each round stochastically at the precision (``emulating(p, seed)``)
instead of one ULP from the twin: an envelope wide enough for a device's own rounding,
and what it then lets through.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
sys.path.insert(0, str(REPO))

FAMILIES = ("cnn", "transformer", "gru")
PRECISIONS = ("fp32", "tf32", "bf16")
PLANTED = ("lr", "lr1e-3", "swap@2", "swap@5", "bias@2", "bias@5")
ULP_SEEDS = range(1, 7)
"""The one-ULP seeds: six, as ``capture --envelope`` makes (``DEFAULT_RUNS``)."""


def record(out: Path, device: str, steps: int, families: list[str]) -> None:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    from tests.numeric_runs import train

    doc: dict[str, Any] = {"steps": steps, "device": device, "torch": torch.__version__,
                           "cuda": torch.version.cuda, "families": {}}
    if device != "cpu":
        doc["name"] = torch.cuda.get_device_name()
        doc["cudnn"] = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
        doc["capability"] = list(torch.cuda.get_device_capability())
    else:
        doc["name"] = "cpu (the emulation stands in)"
    print(f"recording on {doc['name']}: torch {doc['torch']}, cuda {doc['cuda']}, "
          f"{steps} steps, dropout 0", flush=True)

    def run(kind: str, precision: str, **kw: Any) -> dict[str, Any]:
        start = time.perf_counter()
        try:
            trail = train(kind, steps=steps, threads=1, device=device, dropout=0.0,
                          precision=precision, **kw)
            deterministic = True
        except RuntimeError as exc:  # an op with no deterministic kernel: say so, go on
            print(f"  {kind} {precision} {kw}: deterministic refused ({exc}); again without",
                  flush=True)
            trail = train(kind, steps=steps, threads=1, device=device, dropout=0.0,
                          precision=precision, deterministic=False, **kw)
            deterministic = False
        return {"trail": trail, "deterministic": deterministic,
                "seconds": time.perf_counter() - start}

    for kind in families:
        fam: dict[str, Any] = {}
        for precision in PRECISIONS:
            runs = {"run": run(kind, precision), "again": run(kind, precision)}
            for seed in ULP_SEEDS:
                runs[f"ulp{seed}"] = run(kind, precision, perturb=seed)
            for plant in PLANTED:
                runs[f"plant:{plant}"] = run(kind, precision, plant=plant)
            same = runs["run"]["trail"] == runs["again"]["trail"]
            fam[precision] = runs
            print(f"  {kind:12} {precision}: {len(runs)} runs, "
                  f"{statistics.median(r['seconds'] for r in runs.values()):.2f} s each; "
                  f"run again bit-identical: {same}; last loss "
                  f"{runs['run']['trail'][-1]['loss']:.6g}", flush=True)
        doc["families"][kind] = fam
        out.write_text(json.dumps(doc))
    print(f"wrote {out}", flush=True)


def _pts(trail: list[dict[str, Any]]) -> list[Any]:
    from manifest.models import NumericPoint

    return [NumericPoint.model_validate(p) for p in trail]


def _first_step_distance(a: list[Any], b: list[Any]) -> float:
    from manifest.numeric.envelope import step_distance

    measured = step_distance(a[0], b[0])
    return float("nan") if measured is None else max(measured[1])


def _call(verdict: Any) -> str:
    if verdict.verdict == "equivalent":
        return f"equivalent ({verdict.closest:.2g})"
    if verdict.verdict == "differs":
        times = verdict.times_outside
        return f"differs @{verdict.first_step} ({times:.3g}x)"
    return f"{verdict.verdict}: {verdict.reason}"


def load(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    doc: dict[str, Any] = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b"
                                     else data)
    return doc


def judge_files(files: list[Path], *, stochastic: bool = False,
                families: list[str] | None = None) -> dict[tuple[str, str], list[int]]:
    """Print every verdict; return ``{(error, pair): [wrong, judged]}``."""
    import torch

    from manifest.launch.boot._manifest_precision import emulating
    from manifest.numeric.envelope import judge, measure_envelope
    from manifest.numeric.precision import at_precision
    from manifest.numeric.twin import check_twin
    from tests.numeric_runs import train

    torch.set_num_threads(1)
    docs = [load(f) for f in files]
    steps = docs[0]["steps"]
    totals: dict[tuple[str, str], list[int]] = {}

    def envelope_run(kind: str, precision: str, seed: int, threads: int) -> list[Any]:
        if stochastic and precision != "fp32":
            with emulating(precision, seed):
                return _pts(train(kind, steps=steps, threads=threads, dropout=0.0))
        return _pts(train(kind, steps=steps, threads=threads, dropout=0.0,
                          perturb=seed if threads == 1 else None, precision=precision))

    def count(name: str, pair: str, wrong: bool) -> None:
        cell = totals.setdefault((name, pair), [0, 0])
        cell[0] += wrong
        cell[1] += 1

    print(f"device files: {', '.join(d['name'] + ' (torch ' + d['torch'] + ')' for d in docs)}"
          f"; {steps} steps, dropout 0; the recorded run is CPU float32, 1 thread")
    for kind in families or list(docs[0]["families"]):
        base = _pts(train(kind, steps=steps, threads=1, dropout=0.0))
        cpu: dict[str, dict[str, Any]] = {}
        for precision in PRECISIONS:
            runs = [(f"1 ULP (seed {s})", envelope_run(kind, precision, s, 1))
                    for s in ULP_SEEDS]
            runs.append(("threads 1 → 2", envelope_run(kind, precision, 99, 2)))
            if precision == "fp32":
                twin, envelope = None, measure_envelope(base, runs)
                refused: list[str] = []
            else:
                twin = _pts(train(kind, steps=steps, threads=1, dropout=0.0,
                                  precision=precision))
                envelope = at_precision(base, runs, precision, "emulated", twin=twin)
                refused = check_twin(envelope, base)
            planted = {p: _pts(train(kind, steps=steps, threads=1, dropout=0.0, plant=p,
                                     precision=precision)) for p in PLANTED}
            cpu[precision] = {"twin": twin, "envelope": envelope, "refused": refused,
                              "planted": planted}
        for doc in docs:
            device = doc["name"]
            for precision in PRECISIONS:
                mine = cpu[precision]
                reference = mine["twin"] or base
                recorded = doc["families"][kind][precision]
                pair = f"{device} {precision} → CPU fp32"
                if mine["refused"]:
                    print(f"{kind:12} {pair}: the CPU envelope is refused "
                          f"({'; '.join(mine['refused'])}): nothing judged")
                    continue
                start = _first_step_distance(base, _pts(recorded["run"]["trail"]))
                twin_start = (_first_step_distance(reference, _pts(recorded["run"]["trail"]))
                              if mine["twin"] else float("nan"))
                honest, planted_calls = [], []
                for label, entry in recorded.items():
                    if label == "again":  # the run's bits again (checked when recorded)
                        continue
                    verdict = judge(reference, _pts(entry["trail"]), mine["envelope"])
                    if label.startswith("plant:"):
                        count("false equivalent", pair, verdict.verdict == "equivalent")
                        planted_calls.append(f"{label[6:]} {_call(verdict)}")
                    else:
                        count("false differs", pair, verdict.verdict != "equivalent")
                        honest.append(f"{label} {_call(verdict)}")
                print(f"{kind:12} {pair}: step-1 distance from the CPU run {start:.3g}, "
                      f"from the twin {twin_start:.3g}\n    honest: {'; '.join(honest)}\n"
                      f"    planted: {'; '.join(planted_calls)}")
                # The other direction: the device's own one-ULP envelope (measured), the
                # CPU's (emulated) re-run and its planted changes judged against it.
                own = [(f"1 ULP (seed {s})", _pts(recorded[f"ulp{s}"]["trail"]))
                       for s in ULP_SEEDS]
                device_run = _pts(recorded["run"]["trail"])
                measured = at_precision(device_run, own, precision, "measured")
                back = (f"CPU {precision}{' (emulated)' if precision != 'fp32' else ''} → "
                        f"{device} {precision}")
                rerun = mine["twin"] or base
                verdict = judge(device_run, rerun, measured)
                count("false differs", back, verdict.verdict != "equivalent")
                calls = []
                for plant, trail in mine["planted"].items():
                    v = judge(device_run, trail, measured)
                    count("false equivalent", back, v.verdict == "equivalent")
                    calls.append(f"{plant} {_call(v)}")
                print(f"    reverse, {back} against the device's measured envelope: "
                      f"{_call(verdict)}; planted: {'; '.join(calls)}")
        if len(docs) == 2:
            a, b = (d["families"][kind] for d in docs)
            for precision in PRECISIONS:
                same = a[precision]["run"]["trail"] == b[precision]["run"]["trail"]
                run_a = _pts(a[precision]["run"]["trail"])
                own = [(f"1 ULP (seed {s})", _pts(a[precision][f"ulp{s}"]["trail"]))
                       for s in ULP_SEEDS]
                measured = at_precision(run_a, own, precision, "measured")
                pair = f"{docs[1]['name']} → {docs[0]['name']} {precision}"
                verdict = judge(run_a, _pts(b[precision]["run"]["trail"]), measured)
                count("false differs", pair, not same and verdict.verdict != "equivalent")
                calls = []
                for label, entry in b[precision].items():
                    if label.startswith("plant:"):
                        v = judge(run_a, _pts(entry["trail"]), measured)
                        count("false equivalent", pair, v.verdict == "equivalent")
                        calls.append(f"{label[6:]} {_call(v)}")
                print(f"{kind:12} {pair}: bit-identical {same}; "
                      f"{'identical' if same else _call(verdict)}; planted: {'; '.join(calls)}")
    print("\ntotals (wrong / judged):")
    for (name, pair), (wrong, judged) in sorted(totals.items(), key=lambda kv: kv[0][1]):
        print(f"  {pair:45} {name:17} {wrong} / {judged}")
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    rec = sub.add_parser("record", help="train on the device, write the trails")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--device", default="cuda")
    rec.add_argument("--steps", type=int, default=20)
    rec.add_argument("--families", default=",".join(FAMILIES))
    jud = sub.add_parser("judge", help="judge recorded device trails against CPU envelopes")
    jud.add_argument("files", type=Path, nargs="+")
    jud.add_argument("--stochastic", action="store_true",
                     help="TF32/bf16 envelope runs that round stochastically (wider)")
    jud.add_argument("--families", help="a comma-separated subset of the file's families")
    args = parser.parse_args()
    if args.verb == "record":
        record(args.out, args.device, args.steps, args.families.split(","))
    else:
        if len(args.files) > 2:
            parser.error("at most two device files")
        judge_files(args.files, stochastic=args.stochastic,
                    families=args.families.split(",") if args.families else None)


if __name__ == "__main__":
    main()
