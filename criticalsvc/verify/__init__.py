"""`criticalsvc verify`: a bounded model checker over the simulator (design/criticalservice.md §7).

    configurations  the catalogue, the menus, the bound, and every configuration within it
    interleavings   the simulator's nondeterminism as explicit choice points; every path to a depth
    oracle          safety and liveness, judged from the configuration's intent and the raw store
    explorer        the search, minimization, and the bundles that replay what it found
"""
