"""The dispatcher's loop: the conductor and its timers, admission cycles, lifecycle
steps, the durable transitions, held room, start estimates, the worker-side fence
against a lost manager, and the wiring of `dispatcher run`.
"""
