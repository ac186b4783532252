"""Event names: the same (node, reason, message) always lands on the same Event object."""

from gpuhealth_operator.client import events


def test_same_report_same_name_and_different_report_different_name() -> None:
    a = events.event_name("gpu-1", "NodeCordoned", "Node cordoned by policy p: EccUncorrectable.")
    assert a == events.event_name("gpu-1", "NodeCordoned", "Node cordoned by policy p: EccUncorrectable.")
    assert a != events.event_name("gpu-2", "NodeCordoned", "Node cordoned by policy p: EccUncorrectable.")
    assert a != events.event_name("gpu-1", "NodeDrained", "Node cordoned by policy p: EccUncorrectable.")
    assert a.startswith("gpu-1.")
    assert len(a) <= 253
