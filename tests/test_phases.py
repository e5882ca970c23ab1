"""Where a run's time goes: seconds by phase, and a loop call split into its first step,
training and validation (`TrainResult.phases`), on a fake clock."""

from __future__ import annotations

from mdtrain.phases import PhaseClock


def test_phases_add_up_in_the_order_they_first_ran():
    ticks = iter([0.0, 2.0, 2.0, 2.5, 3.0, 4.0])
    clock = PhaseClock(now=lambda: next(ticks))
    for name in ("import", "restore", "import"):  # 0-2, 2-2.5, 3-4
        with clock.phase(name):
            pass
    assert clock.seconds() == {"import": 3.0, "restore": 0.5}
    assert list(clock.seconds()) == ["import", "restore"]


def test_a_loop_call_is_its_first_step_then_training_and_validation():
    now = [0.0]
    clock = PhaseClock(now=lambda: now[0])
    timer = clock.segment_timer()  # made as the loop is called: its clock starts at 0

    def at(seconds: float, hook: str, *args) -> None:
        now[0] = seconds
        getattr(timer, hook)(*args)

    at(5.0, "on_train_batch_end", 0)  # the first call: traced, compiled, its steps run
    at(6.0, "on_train_batch_end", 1)
    at(7.0, "on_test_begin")
    at(9.0, "on_test_end")  # epoch 1's validation: 2 s
    at(10.0, "on_train_batch_end", 0)
    at(11.0, "on_test_begin")
    at(12.0, "on_test_end")  # epoch 2's: 1 s
    at(12.5, "on_train_end")
    assert clock.seconds() == {"first_step": 5.0, "training": 4.5, "validation": 3.0}
