"""Shipped defaults a security review accepts: every NetworkPolicy rule names its peers,
in every shipped rendering, and the chart's network values reach the policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy.conftest import OVERLAYS

Objects = list[dict[str, Any]]
OPEN = {"0.0.0.0/0", "::/0"}


def policy_problems(objects: Objects) -> list[str]:
    """Rules of every NetworkPolicy that admit any peer: no ``from``/``to``, an empty
    one, an empty peer, or an ipBlock of the whole address space."""
    problems = []
    for obj in objects:
        if obj["kind"] != "NetworkPolicy":
            continue
        name, spec = obj["metadata"]["name"], obj["spec"]
        for direction, peers_key in (("ingress", "from"), ("egress", "to")):
            for i, rule in enumerate(spec.get(direction) or []):
                where = f"{name} {direction}[{i}]"
                peers = rule.get(peers_key)
                if not peers:
                    problems.append(f"{where}: no {peers_key}: (any peer)")
                    continue
                for peer in peers:
                    if not peer:
                        problems.append(f"{where}: an empty peer (any peer)")
                    cidr = (peer.get("ipBlock") or {}).get("cidr")
                    if cidr in OPEN:
                        problems.append(f"{where}: ipBlock {cidr}")
                    for sel in ("namespaceSelector", "podSelector"):
                        if sel in peer and not peer[sel] and len(peer) == 1:
                            problems.append(f"{where}: an empty {sel} (every {sel[:-8]})")
                if not rule.get("ports"):
                    problems.append(f"{where}: every port")
    return problems


def test_the_check_finds_an_open_rule() -> None:
    open_policy = [{"kind": "NetworkPolicy", "metadata": {"name": "p"}, "spec": {
        "ingress": [{"ports": [{"port": 1}]}],
        "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 1}]},
                   {"to": [{"namespaceSelector": {}}], "ports": [{"port": 2}]},
                   {"to": [{}]}]}}]
    assert policy_problems(open_policy) == [
        "p ingress[0]: no from: (any peer)", "p egress[0]: ipBlock 0.0.0.0/0",
        "p egress[1]: an empty namespaceSelector (every namespace)",
        "p egress[2]: an empty peer (any peer)", "p egress[2]: every port"]


def test_every_shipped_kustomization_names_the_peers_of_every_rule(
        rendered: dict[str, Objects]) -> None:
    for name, objects in rendered.items():
        assert [o for o in objects if o["kind"] == "NetworkPolicy"], name
        assert policy_problems(objects) == [], name


@pytest.mark.parametrize("mode", OVERLAYS)
def test_every_chart_mode_names_the_peers_of_every_rule(
        mode: str, helm_rendered: dict[str, Objects]) -> None:
    assert policy_problems(helm_rendered[mode]) == []


def test_the_chart_takes_the_network_from_values(helm: Path) -> None:
    from tests.deploy.chart import template

    objects = template(helm, {"networkPolicy": {
        "apiServer": [{"ipBlock": {"cidr": "10.20.0.10/32"}}],
        "temporal": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
        "metricsFrom": [{"namespaceSelector": {"matchLabels": {"team": "obs"}}}],
        "probesFrom": [{"ipBlock": {"cidr": "10.1.0.0/16"}}],
        "extraEgress": [{"to": [{"ipBlock": {"cidr": "10.30.0.5/32"}}],
                         "ports": [{"port": 9090}]}]}})
    (policy,) = [o["spec"] for o in objects if o["kind"] == "NetworkPolicy"]
    assert policy_problems(objects) == []
    peers = {tuple(p["port"] for p in r["ports"]): r["to"] for r in policy["egress"]}
    assert peers[(443, 6443)] == [{"ipBlock": {"cidr": "10.20.0.10/32"}}]
    assert peers[(7233,)] == [{"ipBlock": {"cidr": "203.0.113.0/24"}}]
    assert peers[(9090,)] == [{"ipBlock": {"cidr": "10.30.0.5/32"}}]
    sources = {tuple(p["port"] for p in r["ports"]): r["from"] for r in policy["ingress"]}
    assert sources == {(9464, 9465): [{"namespaceSelector": {"matchLabels": {"team": "obs"}}}],
                       (8080,): [{"ipBlock": {"cidr": "10.1.0.0/16"}}]}


@pytest.mark.parametrize(("values", "named"), [
    ({"networkPolicy": {"metricsFrom": []}}, "metricsFrom"),
    ({"networkPolicy": {"apiServer": []}}, "apiServer"),
    ({"networkPolicy": {"extraEgress": [{"ports": [{"port": 9090}]}]}}, "to"),
    ({"networkPolicy": {"temporal": [{}]}}, "temporal"),
])
def test_an_open_network_value_fails_naming_it(
        helm: Path, values: dict[str, Any], named: str) -> None:
    from tests.deploy.chart import HelmFailed, template

    with pytest.raises(HelmFailed) as err:
        template(helm, values)
    assert named in err.value.stderr


def test_the_chart_sets_the_key_file_and_refuses_another(helm: Path, tmp_path: Path) -> None:
    from tests.deploy.chart import HelmFailed, template

    with pytest.raises(HelmFailed) as err:
        template(helm, {"config": {"temporal": {"api_key_file": "/tmp/key"}}})
    assert "config.temporal.api_key_file" in err.value.stderr
