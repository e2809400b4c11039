"""The authenticated message transport between amoebad, the job's agents and amoebactl.

:mod:`.munge` signs and checks credentials (libmunge); :mod:`.channel` carries JSON messages over ZeroMQ with a
credential on every frame pair. Both sit below ``agent/``, ``daemon/``, ``launcher/`` and ``cli/``, which all talk
through them and import nothing from one another for it.
"""
