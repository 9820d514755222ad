"""The Pareto front with intervals (leaderboards/pareto.py) on toy tables."""
from leaderboards.pareto import Point, front


def test_without_intervals_it_is_the_usual_front():
    pts = [Point(0.0, 3.0), Point(1.0, 1.0), Point(2.0, 2.0), Point(3.0, 0.0)]
    assert front(pts) == [True, True, False, True]


def test_differences_inside_the_intervals_do_not_dominate():
    # 0.954 vs 0.9535 accuracy loss, both +-0.013: neither is ahead, so both stay on the front
    a = Point(0.0460, 1.0, (0.033, 0.059), None)
    b = Point(0.0465, 1.0, (0.0335, 0.0595), None)
    assert front([a, b]) == [True, True]
    c = Point(0.20, 1.0, (0.18, 0.22), None)        # separated on x and tied on y: dominated
    assert front([a, b, c]) == [True, True, False]


def test_a_point_better_on_one_axis_and_worse_beyond_the_interval_on_the_other_is_not_dominated():
    blocked = Point(0.30, 0.0, (0.28, 0.32), None)  # hides everything, costs utility
    leaky = Point(0.00, 1.0, (-0.01, 0.01), None)
    assert front([blocked, leaky]) == [True, True]


def test_higher_is_better_axes():
    pts = [Point(0.9, 0.9), Point(0.8, 0.8), Point(0.95, 0.5)]
    assert front(pts, lower_x=False, lower_y=False) == [True, False, True]
