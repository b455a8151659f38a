"""The shipped GPU reset script, run by a real shell against a stand-in nvidia-smi that is
as unkind as the real one: a GPU with persistence mode on, or held by a process, refuses
its reset. The stand-in keeps each GPU's state in files and logs every call, in order."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from activities.job_templates import RESET_COMMAND
from activities.jobs import reset_holders

UUIDS = [f"GPU-5f0c6a2e-8d0b-4c1e-9a57-6b1f3c2d9e4{i}" for i in range(4)]

FAKE_SMI = r"""#!/bin/sh
# nvidia-smi as the reset script calls it; state in $STATE, every call logged.
echo "$*" >> "$STATE/log"
id=""; query=""; pm=""; reset=""; apps=""
while [ $# -gt 0 ]; do
  case "$1" in
    -i) id="$2"; shift ;;
    --query-gpu=*) query="${1#--query-gpu=}" ;;
    --query-compute-apps=*) apps=1 ;;
    -pm) pm="$2"; shift ;;
    --gpu-reset|-r) reset=1 ;;
  esac
  shift
done
all=$(cat "$STATE/uuids")
resolve() {  # an index or a UUID -> the UUID, or nothing
  n=0; for u in $all; do
    if [ "$1" = "$u" ] || [ "$1" = "$n" ]; then echo "$u"; return; fi; n=$((n+1)); done
}
if [ -n "$apps" ]; then cat "$STATE/held" 2>/dev/null; exit 0; fi
targets=$all
if [ -n "$id" ]; then targets=$(resolve "$id")
  [ -n "$targets" ] || { echo "No devices were found"; exit 6; }; fi
if [ "$query" = "uuid" ]; then for u in $targets; do echo "$u"; done; exit 0; fi
if [ "$query" = "persistence_mode" ]; then cat "$STATE/pm_$targets"; exit 0; fi
if [ -n "$pm" ]; then
  for u in $targets; do
    if [ "$pm" = 1 ]; then echo Enabled > "$STATE/pm_$u"; else echo Disabled > "$STATE/pm_$u"; fi
  done; exit 0; fi
if [ -n "$reset" ]; then
  for u in $targets; do
    if [ "$(cat "$STATE/pm_$u")" = Enabled ] || grep -q "^$u," "$STATE/held" 2>/dev/null; then
      echo "Unable to reset GPU $u because it's being used by some other process"; exit 255
    fi
  done
  for u in $targets; do echo "$u" >> "$STATE/reset"; done
  echo "GPU reset."; exit 0
fi
exit 2
"""


@pytest.fixture
def node(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    (state / "uuids").write_text(" ".join(UUIDS))
    for i, u in enumerate(UUIDS):
        (state / f"pm_{u}").write_text("Disabled\n" if i == 3 else "Enabled\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    # chroot into the driver root: here the stand-in on PATH stands for the driver's tools.
    (bin_dir / "chroot").write_text('#!/bin/sh\nshift\nexec "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return tmp_path


def run(node: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", "-c", RESET_COMMAND], capture_output=True, text=True, timeout=30,
        env={"PATH": f"{node / 'bin'}:{os.environ['PATH']}", "STATE": str(node / "state"),
             "DRIVER_ROOT": str(node / "no-driver-root"), **env}, check=False)


def state(node: Path, name: str) -> str:
    path = node / "state" / name
    return path.read_text() if path.exists() else ""


def test_resets_the_target_by_uuid_with_persistence_off_and_restores_it(node: Path) -> None:
    done = run(node, GPU_UUIDS=UUIDS[1])
    assert done.returncode == 0, done.stdout + done.stderr
    assert state(node, "reset").split() == [UUIDS[1]]
    calls = state(node, "log").splitlines()
    off = calls.index(f"-i {UUIDS[1]} -pm 0")
    reset = calls.index(f"-i {UUIDS[1]} --gpu-reset")
    on = calls.index(f"-i {UUIDS[1]} -pm 1")
    assert off < reset < on
    # Exactly the target: no other GPU's persistence mode was touched.
    assert [c for c in calls if "-pm" in c] == [f"-i {UUIDS[1]} -pm 0", f"-i {UUIDS[1]} -pm 1"]
    assert [state(node, f"pm_{u}").strip() for u in UUIDS] == ["Enabled"] * 3 + ["Disabled"]


def test_an_index_is_turned_into_its_uuid_first(node: Path) -> None:
    assert run(node, GPU_INDEX="2").returncode == 0
    assert state(node, "reset").split() == [UUIDS[2]]
    assert f"-i {UUIDS[2]} --gpu-reset" in state(node, "log")


def test_every_gpu_together_and_persistence_back_only_where_it_was_on(node: Path) -> None:
    assert run(node).returncode == 0
    assert "--gpu-reset" in state(node, "log").splitlines()  # one reset of the baseboard
    assert sorted(state(node, "reset").split()) == sorted(UUIDS)
    assert f"-i {UUIDS[3]} -pm" not in state(node, "log"), "GPU 3 was off: left alone"
    assert [state(node, f"pm_{u}").strip() for u in UUIDS] == ["Enabled"] * 3 + ["Disabled"]


def test_a_refusal_lists_the_holders_and_still_restores_persistence(node: Path) -> None:
    (node / "state" / "held").write_text(f"{UUIDS[0]}, 4242, /usr/bin/python3\n")
    done = run(node, GPU_UUIDS=UUIDS[0])
    assert done.returncode != 0
    assert "being used by some other process" in done.stdout
    assert reset_holders(done.stdout) == [f"pid 4242 (/usr/bin/python3) on {UUIDS[0]}"]
    assert state(node, f"pm_{UUIDS[0]}").strip() == "Enabled"
    assert not state(node, "reset")


def test_a_uuid_the_node_does_not_have_ends_the_step(node: Path) -> None:
    done = run(node, GPU_UUIDS="GPU-00000000-0000-0000-0000-00000000dead")
    assert done.returncode == 6 and "No devices were found" in done.stdout
    assert "-pm 0" not in state(node, "log") and not state(node, "reset")
