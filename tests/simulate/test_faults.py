"""The fault model: published defaults, and a file that is refused naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.simulate.faults import (
    CAUSES,
    FaultModel,
    FaultModelError,
    load_fault_model,
)
from worker.simulate.fleet import draw_faults


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "faults.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_are_the_llama3_interruptions_per_gpu_day() -> None:
    # arXiv 2407.21783: 419 unexpected interruptions in 54 days on 16,384 H100s.
    assert sum(c.count for c in CAUSES.values()) == 419
    rates = FaultModel().rates_per_gpu_day
    assert sum(rates.values()) == pytest.approx(419 / (54 * 16_384))
    assert rates["hbm3"] == pytest.approx(72 / (54 * 16_384))
    # Per 1,000 node-days of 8 GPUs: inside Meta's 2.3 to 6.5 (arXiv 2410.21680).
    assert 2.3 <= sum(rates.values()) * 8 * 1000 <= 6.5


@pytest.mark.parametrize(("text", "field"), [
    ("rates_per_gpu_day: {gpu: 0.001, cosmic_rays: 0.1}\n",
     "rates_per_gpu_day.cosmic_rays: unknown cause"),
    ("rates_per_gpu_day: {hbm3: -0.001}\n", "rates_per_gpu_day.hbm3: rate must be a number >= 0"),
    ("rates_per_gpu_day: {gpu: 0.6, hbm3: 0.5}\n",
     "rates_per_gpu_day: rates sum to 1.1 faults per GPU-day, past one per GPU-day"),
    ("outcomes: {success: 0.5, relapse: 0.2}\n", "outcomes: probabilities sum to 0.7, not 1"),
    ("outcomes: {success: 0.9, melted: 0.1}\n", "outcomes.melted: unknown outcome"),
    ("repair_minutes: {reboot: -1}\n", "repair_minutes.reboot"),
    ("rate_per_gpu_day: {gpu: 0.001}\n", "rate_per_gpu_day"),
])
def test_a_bad_file_is_refused_naming_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(FaultModelError) as err:
        load_fault_model(path)
    assert str(err.value).startswith(f"{path}: ")
    assert field in str(err.value)


def test_a_file_sets_its_own_rates_and_leaves_out_the_rest(tmp_path: Path) -> None:
    model = load_fault_model(write(tmp_path, "rates_per_gpu_day: {thermal: 0.01}\n"))
    assert model.rates_per_gpu_day["thermal"] == 0.01
    assert sum(model.rates_per_gpu_day.values()) == 0.01


def test_the_fault_sequence_is_the_seeds() -> None:
    model = FaultModel()
    one = draw_faults(model, nodes=2000, gpus=8, days=7, seed=1)
    assert one == draw_faults(model, nodes=2000, gpus=8, days=7, seed=1)
    assert one != draw_faults(model, nodes=2000, gpus=8, days=7, seed=2)
    # About 0.47 faults per 1,000 GPU-days: ~53 in a week of 16,000 GPUs.
    assert 25 <= len(one) <= 90
    assert [f.at for f in one] == sorted(f.at for f in one)
