"""Moved: ``sa-jobqueue verify``'s stress run is :mod:`sa_jobqueue.verify`.

Only the workers' application stays importable here (``sa_jobqueue.ops.verify.tasks:queue``),
for commands written against the earlier path.
"""
