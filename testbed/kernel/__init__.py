"""The only door to the kernel: network namespaces, links, qdiscs and sysctls through netlink (pyroute2).

Everything the project creates is named with PREFIX, so `testbed clean` can find exactly what is ours and nothing
else.
"""

PREFIX = "tb"
