"""A fleet that sizes itself (inference.replicas=auto): a pure policy (policy.py) over the run's own signals
(signals.py), and the controller that reads them and acts through the launcher (controller.py). docs/elastic.md."""
