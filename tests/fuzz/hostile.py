"""Hostile dcgm-exporter bodies of a chosen size, one builder per category of the security
review: what each one did to the old parser is in its docstring.

Shared by the linear-time test (tests/test_exposition_hostile.py), the fuzz suite and the
seed corpus (tests/fuzz/corpus/, written by ``python -m tests.fuzz.hostile``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

NAME = "DCGM_FI_DEV_XID_ERRORS"
GOOD = f'{NAME}{{gpu="0",UUID="GPU-0",Hostname="n1"}} 0\n'


def _pad(line_of: Callable[[int], str], size: int) -> bytes:
    """One line of about ``size`` bytes after a valid one (so the body has samples)."""
    return (GOOD + line_of(size)).encode()


def blanks_in_label_set(size: int) -> bytes:
    """Blanks between two optional blank runs, then garbage: quadratic backtracking (120 KB
    held the event loop 16.7 s)."""
    return _pad(lambda n: f'{NAME}{{gpu="0"' + " " * n + "x} 1\n", size)


def blanks_before_close(size: int) -> bytes:
    """Blanks at the end of an unclosed label set."""
    return _pad(lambda n: f'{NAME}{{gpu="0",UUID="GPU-1"' + " " * n + "\n", size)


def blanks_in_tail(size: int) -> bytes:
    """Blanks between value, timestamp and a third token."""
    return _pad(lambda n: f'{NAME}{{gpu="1"}} 1' + " \t" * (n // 2) + "x y\n", size)


def commas_and_blanks(size: int) -> bytes:
    """Empty label slots: ', , , ,'."""
    return _pad(lambda n: f'{NAME}{{gpu="0"' + " ," * (n // 2) + "} 1\n", size)


def long_label_value(size: int) -> bytes:
    """One label value of ``size`` characters (over the identity-label cap when it is UUID)."""
    return _pad(lambda n: f'{NAME}{{gpu="1",pod="' + "a" * n + '"} 1\n', size)


def escaped_unterminated_value(size: int) -> bytes:
    """Backslash-quote pairs with no closing quote."""
    return _pad(lambda n: f'{NAME}{{gpu="1",pod="' + '\\"' * (n // 2) + "} 1\n", size)


def many_labels(size: int) -> bytes:
    """Thousands of labels on one line."""
    return _pad(lambda n: f"{NAME}{{gpu=\"1\"," +
                "".join(f'l{i}="v",' for i in range(n // 10)) + "} 1\n", size)


def huge_number(size: int) -> bytes:
    """A value of ``size`` digits (a 5000-digit label raised out of the tick)."""
    return _pad(lambda n: f'{NAME}{{gpu="1",UUID="GPU-1"}} ' + "9" * n + "\n", size)


def huge_gpu_label(size: int) -> bytes:
    """A ``gpu`` label of ``size`` digits: int() raises past 4300 digits."""
    return _pad(lambda n: f'{NAME}{{gpu="' + "7" * n + '",UUID="GPU-1"} 79\n', size)


def many_bad_lines(size: int) -> bytes:
    """Many lines, each with blanks inside its label set."""
    line = f'{NAME}{{gpu="0"' + " " * 200 + "x} 1\n"
    return (GOOD + line * max(1, size // len(line))).encode()


def many_gpus(size: int) -> bytes:
    """Fake GPUs: 20k of them in 1 MB produced an observation Temporal refused."""
    lines = []
    total, i = len(GOOD), 0
    while total < size:
        line = f'{NAME}{{gpu="{i % 10000}",UUID="GPU-{i}",Hostname="n1"}} 79\n'
        lines.append(line)
        total += len(line)
        i += 1
    return (GOOD + "".join(lines)).encode()


CATEGORIES: dict[str, Callable[[int], bytes]] = {
    f.__name__: f for f in (
        blanks_in_label_set, blanks_before_close, blanks_in_tail, commas_and_blanks,
        long_label_value, escaped_unterminated_value, many_labels, huge_number,
        huge_gpu_label, many_bad_lines, many_gpus,
    )
}

# Small hostile bodies for the corpus: the review's "garbage that remediates" and friends,
# each after a valid line (so that the body holds samples and the bad line is what is refused).
_GARBAGE: dict[str, bytes] = {
    "fullwidth_gpu": f'{NAME}{{gpu="\uff10",UUID="GPU-1",Hostname="n1"}} 79\n'.encode(),
    "arabic_indic_value": f'{NAME}{{gpu="0",UUID="GPU-1",Hostname="n1"}} \u0667\u0669\n'.encode(),
    "devanagari_value": f'{NAME}{{gpu="0",UUID="GPU-1",Hostname="n1"}} \u096d\u096f\n'.encode(),
    "fullwidth_value": f'{NAME}{{gpu="0",UUID="GPU-1",Hostname="n1"}} \uff17\uff19\n'.encode(),
    "fractional_xid": f'{NAME}{{gpu="0",UUID="GPU-1",Hostname="n1"}} 79.5\n'.encode(),
    "xid_out_of_range": f'{NAME}{{gpu="0",UUID="GPU-1",Hostname="n1"}} 1e9\n'.encode(),
    "xid_after_eof": (GOOD + "# EOF\n" +
                      f'{NAME}{{gpu="0",UUID="GPU-0",Hostname="n1"}} 79\n').encode(),
    "cut_mid_number": f'{NAME}{{gpu="0",UUID="GPU-1",Hostname="n1"}} 7'.encode(),
    "cut_mid_labels": f'{NAME}{{gpu="0",UUID="GPU-1",Hostn'.encode(),
    "fullwidth_count_xid": ('DCGM_EXP_XID_ERRORS_COUNT{gpu="0",UUID="GPU-1",Hostname="n1",'
                            'xid="\uff17\uff19"} 3\n').encode(),
    "count_xid_5000_digits": ('DCGM_EXP_XID_ERRORS_COUNT{gpu="0",UUID="GPU-1",Hostname="n1",'
                              f'xid="{"7" * 5000}"}} 3\n').encode(),
    "rich_markup_labels": (f'{NAME}{{gpu="0",UUID="[/x][bold]GPU-1",Hostname="n1",'
                           'modelName="[link=http://x]m[/link]"} 79\n').encode(),
    "not_utf8": f'{NAME}{{gpu="0",UUID="GPU-1",Hostname="n1",pod="\xff"}} 79\n'.encode("latin-1"),
    "control_chars": f'{NAME}{{gpu="0",UUID="GPU-1",Hostname="n1"}} 79\x00\n'.encode(),
    "xid_79_valid": f'{NAME}{{gpu="0",UUID="GPU-1",Hostname="n1"}} 79\n'.encode(),
}
GARBAGE: dict[str, bytes] = {
    name: raw if raw.startswith(GOOD.encode()) else GOOD.encode() + raw
    for name, raw in _GARBAGE.items()
}


# Node annotations the review used, and neighbours: each must make only that node unreadable.
ANNOTATIONS: dict[str, str] = {
    "ack_overflow": '{"x":1e999}',
    "ack_deep": "[" * 100_000,
    "ack_nan": '{"x":NaN}',
    "ack_bool": '{"GPU-1":true}',
    "ack_string": '{"GPU-1":"79"}',
    "ack_huge_int": '{"GPU-1":' + "9" * 5000 + "}",
    "ack_list": '["GPU-1",79]',
    "ack_good": '{"GPU-1":79}',
    "history_naive": '[{"started":"2026-12-01T11:00:00","action":"reboot","reason":"r",'
                     '"outcome":"healthy"}]',
    "history_good": '[{"started":"2026-12-01T11:00:00+00:00","action":"reboot","reason":"r",'
                    '"outcome":"healthy"}]',
    "history_year_0001": '[{"started":"0001-01-01T00:00:00+00:00","action":"a","reason":"r",'
                         '"outcome":"o"}]',
    "transition_naive": "2026-12-01T11:00:00",
    "transition_good": "2026-12-01T11:00:00+00:00",
    "sightings_overflow": '{"GPU-1":{"shown":1e999}}',
    "sightings_negative": '{"GPU-1":{"shown":-79,"seen":[[13,-1e308]]}}',
    "sightings_good": '{"GPU-1":{"shown":13,"counts":{"13":2},"seen":[[13,1764590000.0]]}}',
    "huge": '{"GPU-1":79,"pad":"' + "x" * 70_000 + '"}',
}

# Config files: binary, deep, wrong shapes, zero and negative intervals, the exporter's label.
CONFIGS: dict[str, bytes] = {
    "binary": b"\x1f\x8b\x08\x00\xff\xfe\x00garbage",
    "deep": b"[" * 10_000,
    "scalar": b"42\n",
    "list": b"- a\n- b\n",
    "interval_zero": b"detector:\n  interval: 0\n",
    "interval_negative": b"detector:\n  interval: -30\n",
    "interval_huge": b"detector:\n  interval: P400D\n",
    "hostname_label": b"exporter:\n  mode: prometheus\n  prometheus_url: http://p:9090\n"
                      b"  prometheus_node_labels: [Hostname]\n",
    "max_bytes_huge": b"exporter:\n  max_bytes: 1099511627776\n",
    "unknown_field": b"detector:\n  intervall: 30s\n",
    "good": b"detector:\n  interval: PT30S\n  dry_run: true\n",
    "anchors": b"a: &a [*a]\n",
}

# Operator payloads as JSON (updates and signals carry OperatorCommand).
OPERATOR: dict[str, str] = {
    "markup": '{"operator":"[/x]","reason":"[bold]approved[/bold] [link=http://x]y[/link]"}',
    "long_reason": '{"operator":"ops","reason":"' + "r" * 20_000 + '"}',
    "empty_operator": '{"operator":"","reason":"x"}',
    "wrong_types": '{"operator":7,"reason":["a"]}',
    "extra_field": '{"operator":"ops","reason":"r","privileged":true}',
    "control_chars": '{"operator":"ops\\u0000","reason":"\\u001b[31mred"}',
    "good": '{"operator":"alice","reason":"checked the GPU"}',
}


def write_corpus(root: Path) -> None:
    """The seed corpus: garbage bodies and every category at 4 KiB; annotations; config
    files; operator payloads."""
    for kind, items in (
        ("exposition", {**{f"{k}.prom": v for k, v in GARBAGE.items()},
                        **{f"{k}.prom": b(4096) for k, b in CATEGORIES.items()}}),
        ("annotations", {f"{k}.txt": v.encode() for k, v in ANNOTATIONS.items()}),
        ("config", {f"{k}.yaml": v for k, v in CONFIGS.items()}),
        ("operator", {f"{k}.json": v.encode() for k, v in OPERATOR.items()}),
    ):
        folder = root / kind
        folder.mkdir(parents=True, exist_ok=True)
        for name, raw in items.items():
            (folder / name).write_bytes(raw)


if __name__ == "__main__":
    write_corpus(Path(__file__).parent / "corpus")
