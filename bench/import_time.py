"""How long `import workbench` takes, and that it pulls in none of the heavy backends.

Run: .venv/bin/python bench/import_time.py   (prints the median of 5 fresh interpreters)
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

PROBE = (
    "import sys, time, json\n"
    "t = time.perf_counter()\n"
    "import workbench\n"
    "dt = time.perf_counter() - t\n"
    "heavy = sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'ncnn', 'pnnx', 'onnxscript',"
    " 'matplotlib', 'ipywidgets', 'numpy') if m in sys.modules)\n"
    "print(json.dumps({'seconds': dt, 'heavy': heavy}))\n"
)


def measure(runs: int = 5) -> dict:
    results = [json.loads(subprocess.run([sys.executable, "-c", PROBE], check=True,
                                         capture_output=True, text=True).stdout)
               for _ in range(runs)]
    return {"median_s": statistics.median(r["seconds"] for r in results),
            "max_s": max(r["seconds"] for r in results),
            "heavy_modules": results[0]["heavy"]}


if __name__ == "__main__":
    r = measure()
    print(f"import workbench: median {r['median_s'] * 1000:.1f} ms, max {r['max_s'] * 1000:.1f} ms "
          f"over 5 fresh interpreters (budget 1000 ms); heavy modules imported: "
          f"{r['heavy_modules'] or 'none'}")
