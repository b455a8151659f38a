"""The gpu-operator scenario's exporters serve exactly the stock counter set
(dcp-metrics-included.csv), whatever the fleet's switches: the fleet gpu-remediate must tell
is blind to several rules."""

from __future__ import annotations

import re

from sim.gpu.exposition import DEFAULT_FAMILIES, XID_COUNT, render_fleet, render_node
from sim.gpu.fleet import Fleet, NodeSpec
from sim.scenario import load_scenario

FAMILY = re.compile(r"^([A-Z_]+)[{ ]", re.M)


def fleet(**switches: object) -> Fleet:
    nodes = [NodeSpec("stock-1", pool="gpu-operator", gpus=2),
             NodeSpec("full-1", pool="gpu-node", gpus=2)]
    return Fleet(nodes, clock=lambda: 5000.0, **switches)  # type: ignore[arg-type]


def families(text: str) -> set[str]:
    return set(FAMILY.findall(text))


def test_a_gpu_operator_pool_serves_exactly_the_stock_set() -> None:
    f = fleet(extra_fields=True, xid_count_window_ms=300000)
    stock = families(render_node(f, "stock-1"))
    allowed = {fam.name for fam in DEFAULT_FAMILIES}
    assert stock <= allowed
    assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" not in stock
    assert "DCGM_FI_DEV_ROW_REMAP_PENDING" not in stock
    assert XID_COUNT.name not in stock
    full = families(render_node(f, "full-1"))
    assert {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", XID_COUNT.name} <= full


def test_in_a_federation_only_the_stock_nodes_lose_the_extra_series() -> None:
    text = render_fleet(fleet(extra_fields=True))
    dbe = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{")]
    assert dbe and all('Hostname="full-1"' in line for line in dbe)


def test_the_gpu_operator_scenario_is_built_in_and_all_stock() -> None:
    scenario = load_scenario("gpu-operator")
    assert {pool.name for pool in scenario.pools} == {"gpu-operator"}
