"""The algorithms: the one sweep every algorithm runs (:mod:`.base`), the step rule of each
(:mod:`.pie`: ePIE, rPIE and mPIE; :mod:`.lsqml`; :mod:`.dm`), batch selection
(:mod:`.batches`), the variable probe (:mod:`.opr`), and the catalog of their names and traits
(:mod:`.catalog`), the one place a new algorithm is written into beside its class.

Nothing is imported here: the settings read the catalog before any algorithm is loaded.
"""
