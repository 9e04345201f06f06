"""Notebook 07, Spot VMs and preemption:

    drill   the preemption drill: a job run undisturbed and with SIGTERM mid-run, compared bit for bit
    spot    checkpoint interval against lost work against cost; on-demand, Spot and flex-start
    writes  background checkpoint writes against the synchronous save, measured here
"""
