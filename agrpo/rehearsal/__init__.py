"""The rehearsal: a local stand-in for the HF Jobs and Buckets API, so a launcher=hf_jobs plan runs on this machine
(`python -m agrpo ... launcher=hf_jobs sync=bucket --rehearse`) before any GPU is billed. It is its own part: a Hub
backend (backend.py: its flags, its settings, what it yields) the Jobs launcher is handed in place of the Hub, and
nothing here imports the launchers.

hub_api.py (the Hub API's routes, token check and refusals: also the tests' fake Hub, tests/fakes/fake_hub.py),
hub_rules.py (pure: what the Jobs API refuses), plain_transfer.py (bucket files over HTTP in place of Xet), jobs.py
and bucket.py (pure: stages, requeue, URL forms, listing lag), runner.py (a Job as a process group in its own folder
and namespaces), standin.py (state and lifecycle), server.py (API + exposed-port gateway), rehearse.py (start, hand
to the executor, stop; `replay` of a finished rehearsal), backend.py (the Hub backend around it). docs/hf_jobs.md
says what is modelled and what is not.
"""
