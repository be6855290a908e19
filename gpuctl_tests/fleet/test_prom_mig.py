"""A MIG GPU's utilisation from its instances (issue 29), without a Prometheus: weighed by the
GPU's compute slices, known by its model or its instances' profile names (NVIDIA's MIG user
guide), else by the instances' own. The store's side: ``test_prom.py``'s MIG test."""

from __future__ import annotations

from gpuctl.fleet.prommig import mig_slices, mig_util

H100 = "NVIDIA H100 80GB HBM3"


def test_an_idle_gpu_with_one_busy_instance_reads_its_share_of_the_slices() -> None:
    # one 2g instance busy, the other 5 of the H100's 7 slices held by none: 2/7, not 100%
    assert mig_util({"3": ("2g.20gb", 100.0)}, H100) == 29
    assert mig_util({"1": ("3g.40gb", 90.0), "7": ("1g.10gb", 20.0)}, H100) == 41
    assert mig_util({"0": ("7g.80gb", 50.0)}, H100) == 50
    assert mig_util({"0": ("7g.80gb", None)}, H100) is None  # nothing read: unknown, not 0


def test_the_gpus_slices_come_from_its_model_then_its_profiles() -> None:
    assert mig_slices("NVIDIA A100-SXM4-80GB", []) == 7
    assert mig_slices("NVIDIA A30", ["1g.6gb"]) == 4
    assert mig_slices("NVIDIA RTX PRO 6000 Blackwell Server Edition", ["1g.24gb"]) == 4
    assert mig_slices("NVIDIA H200", ["1g.18gb"]) == 7
    # no model: the profile names, where each is a known one of GPUs of one slice count
    assert mig_slices(None, ["3g.40gb", "1g.10gb+me"]) == 7
    assert mig_slices("", ["2g.12gb"]) == 4
    assert mig_slices(None, ["1g.24gb"]) is None  # an H100 94 GB's and an RTX PRO's
    assert mig_slices(None, ["2g.12gb", "3g.40gb"]) is None  # no GPU has both
    assert mig_slices("Some Future GPU", ["5g.99gb"]) is None
    # the A30's 4: one busy 2g instance is half of it
    assert mig_util({"1": ("2g.12gb", 100.0)}, "NVIDIA A30") == 50
    assert mig_util({"1": ("2g.12gb", 100.0)}, None) == 50


def test_unknown_slices_weigh_over_the_instances_present() -> None:
    """A model and profiles not in the tables: over the instances there are (the old rule),
    never more slices held than the GPU is said to have."""
    assert mig_util({"1": ("5g.99gb", 100.0), "2": ("1g.9gb", 40.0)}, "Some Future GPU") == 90
    # a profile table is not a reason to count fewer slices than the instances hold
    assert mig_util({str(i): ("2g.12gb", 100.0) for i in range(3)}, "NVIDIA A30") == 100
