"""testbed.kernel.sysctls.rps_mask: the CPU mask every fabric namespace steers received packets with."""

import pytest

from testbed.kernel.sysctls import rps_mask


@pytest.mark.parametrize("cpus,mask", [(1, "1"), (2, "3"), (4, "f"), (31, "7fffffff"), (32, "ffffffff"),
                                       (33, "1,ffffffff"), (64, "ffffffff,ffffffff"), (72, "ff,ffffffff,ffffffff")])
def test_every_cpu_in_sysfs_mask_format(cpus, mask):
    assert rps_mask(cpus) == mask


def test_default_is_this_machine():
    import os

    assert rps_mask() == rps_mask(os.cpu_count() or 1)
    assert bin(int(rps_mask().replace(",", ""), 16)).count("1") == (os.cpu_count() or 1)
