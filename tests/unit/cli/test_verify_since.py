"""``twg verify --since``: an age or an ISO 8601 time, as milliseconds since the epoch."""

from __future__ import annotations

import pytest

from thalweg.cli.verify import parse_since
from thalweg.errors import ConfigError


def test_an_age_counts_back_from_now_and_a_time_without_a_zone_is_utc() -> None:
    now = 1_800_000_000.0
    assert parse_since("90s", now) == (now - 90) * 1000
    assert parse_since("30m", now) == (now - 1800) * 1000
    assert parse_since("1.5h", now) == (now - 5400) * 1000
    assert parse_since("7d", now) == (now - 7 * 86400) * 1000
    assert parse_since("2026-12-07T06:00:00Z") == 1_796_623_200_000
    assert parse_since("2026-12-07T06:00:00") == 1_796_623_200_000
    assert parse_since("2026-12-07T07:00:00+01:00") == 1_796_623_200_000


@pytest.mark.parametrize("text", ["soon", "30", "-5m", "5 weeks", ""])
def test_anything_else_is_refused_with_both_forms_named(text: str) -> None:
    with pytest.raises(ConfigError, match=r"ISO 8601 time .* or an age"):
        parse_since(text)
