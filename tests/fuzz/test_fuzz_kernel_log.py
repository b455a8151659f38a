"""Fuzz: the kernel log (the node writes it). Properties: the reader never raises; a line cut
anywhere gives its own GPU's own XID or nothing; two messages written into one line give
nothing; arbitrary text never names a GPU whose full address it does not hold."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.strategies import budget
from worker.probe.common import format_pci
from worker.probe.kernel_log import parse_kernel_log, read_log

LINE = ("[ 5000.118734] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.")
OTHER = "[ 5000.2] NVRM: Xid (PCI:0000:3b:00): 13, pid=77, name=python3, Graphics Exception"
NVLINK = ("[ 7000.1] NVRM: Xid (PCI:0018:01:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 08 "
          "(0x00000084 0x00000100 0x00000000 0x00000000 0x00000000 0x00000000)")
_ADDRESS = re.compile(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})")


@budget(300)
@given(st.integers(min_value=0, max_value=len(LINE)))
def test_a_cut_line_gives_its_own_xid_or_nothing(cut: int) -> None:
    found = [(format_pci(x.pci), x.xid) for x in parse_kernel_log(LINE[:cut] + "\n")]
    assert found in ([], [("00000000:18:00.0", 79)])


@budget(300)
@given(st.integers(min_value=0, max_value=len(NVLINK)))
def test_a_cut_nvlink5_line_never_decodes_as_another_subcode(cut: int) -> None:
    for x in parse_kernel_log(NVLINK[:cut] + "\n"):
        assert x.xid == 145
        assert x.detail is None or (x.detail.unit, x.detail.error_status) == ("RLW_REMAP", 0x100)


@budget(300)
@given(st.integers(min_value=0, max_value=len(LINE)), st.integers(min_value=0,
                                                                   max_value=len(OTHER)))
def test_two_messages_in_one_line_give_nothing(i: int, j: int) -> None:
    spliced = LINE[:i] + OTHER[j:]
    log = read_log(spliced + "\n")
    if spliced.count("NVRM:") > 1:
        assert log.xids == []


@budget(300)
@given(st.text(alphabet=st.sampled_from(list("NVRM: Xid(PCI)0123456789abcdef,.[] \n")),
               max_size=400))
def test_garbage_never_names_a_gpu_it_does_not_hold(text: str) -> None:
    addresses = {(int(d, 16), int(b, 16), int(v, 16)) for d, b, v in _ADDRESS.findall(text)}
    for x in parse_kernel_log(text):
        assert x.pci in addresses
