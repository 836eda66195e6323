"""The wheel is the product: `pip install .` installs dlrfeed, the fakegw tool it documents and
the generated stubs they share, and nothing of the tests' or the benchmarks' tooling."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = {"dlrfeed", "fakegw", "gateway"}


def test_the_wheel_holds_the_product_and_its_two_commands(tmp_path: Path) -> None:
    # Built from a copy: setuptools leaves a build/ tree behind, and would reuse a stale one.
    project = tmp_path / "project"
    shutil.copytree(ROOT / "src", project / "src", ignore=shutil.ignore_patterns("*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    build = ["wheel", "--no-deps", "--no-build-isolation", "--quiet", "--wheel-dir", str(tmp_path)]
    subprocess.run(
        [sys.executable, "-m", "pip", *build, str(project)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("dlrfeed-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top_level == PRODUCT_PACKAGES
    assert "dlrfeed = dlrfeed.cli:main" in scripts
    assert "fakegw = fakegw.cli:main" in scripts
    assert any(name.endswith("store/migrations/0001_baseline.sql") for name in names)
