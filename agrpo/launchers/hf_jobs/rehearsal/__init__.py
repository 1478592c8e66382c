"""A local stand-in for the HF Jobs and Buckets API, so `launcher.hf_jobs.rehearse=true` runs the plan on this
machine: jobs.py and bucket.py (pure: stages, requeue, URL forms, listing lag), runner.py (a Job as a process
group in its own folder and namespaces), standin.py (state and lifecycle), server.py (API + exposed-port gateway),
rehearse.py (start, point the launcher at it, stop). docs/hf_jobs.md says what is modelled and what is not.
"""
