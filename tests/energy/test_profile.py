"""Stage profile parsing and validation."""

from __future__ import annotations

import pytest

from hetplan.energy.profile import load_stage_profile, parse_stage_profile
from hetplan.errors import HetplanError

GOOD = """stage,instruction,frequency,time,energy
0,forward,1410,0.05,20
0,backward,1410,0.10,40
0,forward,1000,0.07,15
0,backward,1000,0.14,30
1,forward,1410,0.05,20
1,backward,1410,0.10,40
"""


def test_parse_good():
    p = parse_stage_profile(GOOD)
    assert p.num_stages == 2
    fw = p.get(0, "forward")
    assert list(fw.frequency_mhz) == [1410, 1000]
    assert fw.at_frequency(1000) == (0.07, 15.0)
    assert p.frequencies_mhz == (1410, 1000)
    again = parse_stage_profile(p.to_csv())
    assert again.get(0, "backward").time_s.tolist() == [0.10, 0.14]


def test_reference_profile_loads(gpt_profile):
    assert gpt_profile.num_stages == 8
    assert len(gpt_profile.get(7, "backward").frequency_mhz) == 38
    assert gpt_profile.get(0, "forward").max_frequency_mhz == 1410


@pytest.mark.parametrize(
    "text, needle",
    [
        ("", "empty"),
        ("stage,instruction,frequency,time\n0,forward,1410,0.1\n", "missing column"),
        (GOOD.replace("0.07", "fast"), "not a number"),
        (GOOD.replace("1,forward", "-1,forward"), "negative"),
        (GOOD.replace("0,backward,1000", "0,sideways,1000"), "unknown instruction"),
        (GOOD + "0,forward,1000,0.07,15\n", "duplicate"),
        (GOOD.replace("0.14,30", "0,30"), "positive"),
        (GOOD.replace("0.14,30", "0.14,nan"), "energy"),
        (GOOD.replace("0.14,30", "1e-300,30"), "below 1e-06 s"),  # quantized into ~1e300 units: OverflowError
        (GOOD.replace("1,backward,1410,0.10,40\n", ""), "no backward"),
        (GOOD.replace("1,forward", "2,forward").replace("1,backward", "2,backward"), "stage 1 has no"),
        ("stage,instruction,frequency,time,energy\n", "no data rows"),
        (GOOD.replace("0,forward,1000", "0.5,forward,1000"), "integer"),
    ],
)
def test_bad_profiles(text, needle):
    with pytest.raises(HetplanError) as err:
        parse_stage_profile(text, source="p.csv")
    assert needle in str(err.value)


def test_unknown_stage_and_frequency():
    p = parse_stage_profile(GOOD)
    with pytest.raises(HetplanError, match="no profile for stage 5"):
        p.get(5, "forward")
    with pytest.raises(HetplanError, match="was not profiled"):
        p.get(0, "forward").at_frequency(1234)


def test_missing_file(tmp_path):
    with pytest.raises(HetplanError, match="does not exist"):
        load_stage_profile(tmp_path / "nope.csv")
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(HetplanError, match="not UTF-8"):
        load_stage_profile(tmp_path / "bin.csv")
