"""The browser tests' node drivers (playwright-core, no bundled browser) and the one Debian
Chromium they share: `browser_server.mjs` launches it once for the run, and every driver
connects to it and works in a fresh context of its own (no cookies, storage or cache shared)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
CHROMIUM = Path("/usr/bin/chromium")
NODE = shutil.which("node")
NPM = shutil.which("npm")
ARTIFACTS = HERE / "artifacts"
STEP_TIMEOUT_S = 60
BROWSER_START_S = 60
DRIVER_TIMEOUT_S = 180


def skip_reason() -> str | None:
    missing = [name for name, ok in (("node", NODE), ("npm", NPM)) if not ok]
    if not CHROMIUM.is_file():
        missing.append(str(CHROMIUM))
    return f"the browser tests need {', '.join(missing)}" if missing else None


def install_driver_deps() -> None:
    """playwright-core from the committed lockfile (it downloads no browser), once."""
    if (HERE / "node_modules" / "playwright-core" / "package.json").is_file():
        return
    assert NPM is not None
    subprocess.run([NPM, "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True, timeout=300)


@contextmanager
def shared_browser() -> Iterator[str]:
    """Chromium, launched once; yields the endpoint the drivers connect to (`plan.browser`)."""
    assert NODE is not None
    server = subprocess.Popen(
        [NODE, str(HERE / "browser_server.mjs"), str(CHROMIUM)],
        cwd=HERE,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert server.stdin is not None
    assert server.stdout is not None
    try:
        # The first line is the endpoint; anything else means it did not start.
        line = server.stdout.readline().strip()
        if not line.startswith("ws://"):
            pytest.fail(f"Chromium did not start: {line}{server.stdout.read()[-4000:]}")
        yield line
    finally:
        server.stdin.close()  # browser_server.mjs closes Chromium when its stdin ends
        try:
            server.wait(BROWSER_START_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def run_driver(
    script: str,
    plan: dict[str, Any],
    tmp_path: Path,
    browser: str,
    name: str | None = None,
) -> dict[str, Any]:
    """Run a driver script on `plan` (plus the browser and result paths) and return its result
    (also kept as artifacts/`name`-result.json; `name` defaults to the script's).

    The caller checks `result["error"]`; a driver that wrote no result or ran over time fails here.
    """
    ARTIFACTS.mkdir(exist_ok=True)
    result_path = tmp_path / "result.json"
    plan = {
        **plan,
        "browser": browser,
        "artifacts": str(ARTIFACTS),
        "result": str(result_path),
        "stepTimeoutMs": STEP_TIMEOUT_S * 1000,
    }
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    assert NODE is not None
    driver = subprocess.Popen(
        [NODE, str(HERE / script), str(plan_path)],
        cwd=HERE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        output, _ = driver.communicate(timeout=DRIVER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        driver.terminate()  # Chromium closes the contexts of a driver that went away
        output, _ = driver.communicate(timeout=15)
        pytest.fail(f"the driver ran over {DRIVER_TIMEOUT_S} s:\n{output.decode()[-4000:]}")
    assert result_path.is_file(), f"the driver wrote no result:\n{output.decode()[-4000:]}"
    result: dict[str, Any] = json.loads(result_path.read_text())
    saved = ARTIFACTS / f"{name or Path(script).stem}-result.json"
    saved.write_text(json.dumps(result, indent=2))
    assert result["error"] is not None or driver.returncode == 0, output.decode()[-4000:]
    return result
