"""The replica supervisor's policy (no processes): restart the dead within budget, then give up once, loudly."""

from agrpo.launchers.supervise import ReplicaSupervisor


class FakeReplica:
    """Stands in for a ManagedProcess: only liveness and start matter to the policy."""

    def __init__(self, name):
        self.name, self.up, self.starts = name, True, 0

    def alive(self):
        return self.up

    def start(self):
        self.starts += 1
        self.up = True


def test_a_dead_replica_is_restarted_and_a_live_one_left_alone():
    a, b = FakeReplica("vllm-0"), FakeReplica("vllm-1")
    warnings = []
    supervisor = ReplicaSupervisor([a, b], max_restarts=2, warn=warnings.append)
    assert supervisor.poll() == []
    b.up = False
    assert supervisor.poll() == ["vllm-1"]
    assert (a.starts, b.starts) == (0, 1) and b.alive()
    assert "restarting it (1 of 2)" in warnings[0]


def test_the_budget_runs_out_with_one_warning():
    replica = FakeReplica("vllm-0")
    warnings = []
    supervisor = ReplicaSupervisor([replica], max_restarts=2, warn=warnings.append)
    for _ in range(2):
        replica.up = False
        assert supervisor.poll() == ["vllm-0"]
    replica.up = False
    assert supervisor.poll() == [] and supervisor.poll() == []
    assert replica.starts == 2
    assert len(warnings) == 3 and "inference.max_restarts=2" in warnings[-1]


def test_zero_budget_never_restarts():
    replica = FakeReplica("vllm-0")
    replica.up = False
    supervisor = ReplicaSupervisor([replica], max_restarts=0, warn=lambda _: None)
    assert supervisor.poll() == [] and replica.starts == 0


def test_waiting_polls_the_supervisor_until_the_trainer_exits():
    from agrpo.launchers.supervise import wait_supervised

    class Trainer:
        polls = 0

        def alive(self):
            self.polls += 1
            return self.polls < 4

        def wait(self):
            return 7

    replica = FakeReplica("vllm-0")
    replica.up = False
    supervisor = ReplicaSupervisor([replica], max_restarts=1, warn=lambda _: None)
    assert wait_supervised(Trainer(), supervisor, sleep=lambda _: None) == 7
    assert replica.starts == 1
