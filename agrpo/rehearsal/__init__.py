"""The rehearsal: a local stand-in for the HF Jobs and Buckets API, so a launcher=hf_jobs plan runs on this machine
(`rehearsal.enabled=true`) before any GPU is billed. It is its own part: the Jobs executor is handed its API, token
and gateway (rehearse.py) as what it talks to, and nothing here imports the launchers.

hub_api.py (the Hub API's routes, token check and refusals: also the tests' fake Hub, tests/fakes/fake_hub.py),
hub_rules.py (pure: what the Jobs API refuses), plain_transfer.py (bucket files over HTTP in place of Xet), jobs.py
and bucket.py (pure: stages, requeue, URL forms, listing lag), runner.py (a Job as a process group in its own folder
and namespaces), standin.py (state and lifecycle), server.py (API + exposed-port gateway), rehearse.py (start, hand
to the executor, stop; `replay` of a finished rehearsal). docs/hf_jobs.md says what is modelled and what is not.
"""
