"""What the loader decided in this process, and why the overlay is inactive here if it is.

Written by the bootstrap (``_bootstrap``) and by ``activation`` (when the installer cannot start),
read by ``status`` and the status files. It imports nothing, so those modules share it without
importing one another (the bootstrap runs in every process: no circle may pull ``status`` in).
"""

#: The parsed mode once the bootstrap ran (``off`` included). ``None``: it never ran, which is
#: normal when off (the ``.pth`` pre-filter does not import the bootstrap then).
MODE: "str | None" = None
#: True once the bootstrap ran in this process (whichever way in came first).
BOOTSTRAPPED = False
#: One-line reason if ``activation.enable`` raised (the overlay then stays stock).
ENABLE_ERROR: "str | None" = None
#: The line the loader printed when the installer could not start (the overlay then stays stock).
START_ERROR: "str | None" = None
