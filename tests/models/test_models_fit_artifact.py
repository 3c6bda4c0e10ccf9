"""Pollux's model fitted to the artifact's measured placements.

For each application with placements on aws, rtx and dgx-ext, the model is fitted
to all rows of the file (num_nodes = digits of the placement, num_replicas = their
sum; compute time = step_time - sync_time, optimizer-step time = step_time) and
its predicted step time compared with the measured one. Measured with this code
(relative error |pred / measured - 1|, median / 90th percentile):

    model        aws            rtx            dgx-ext
    bert         0.043 / 0.178  0.061 / 0.122  0.017 / 0.048
    cifar10      0.065 / 0.153  0.035 / 0.084  0.025 / 0.066
    deepspeech2  0.062 / 0.165  0.047 / 0.133  0.051 / 0.140
    imagenet     0.049 / 0.143  0.052 / 0.121  0.065 / 0.158
    ncf          0.065 / 0.203  0.050 / 0.133  0.075 / 0.163
    yolov3       0.056 / 0.214  0.097 / 0.183  0.230 / 0.397

Pooled over all 18 fits: median 0.055, p90 0.170. yolov3 on dgx-ext is the outlier:
its step time grows with the replica count within one node (0.39 s at 1 GPU,
0.94 s at 8, bsz 32) while its sync time stays small, which a model with
replica-independent compute time cannot follow. gpt_pmp is left out: its files
record pipeline stages, with sync_time > step_time.
"""

import numpy as np
import pytest

from sia_grpc.models import fit_perf_params, load_placements, sync_time

MODELS = ["bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"]
TYPES = ["aws", "rtx", "dgx-ext"]
# (median, p90) bounds: the measured values above plus a little headroom.
LOOSER = {("yolov3", "rtx"): (0.12, 0.25), ("yolov3", "dgx-ext"): (0.26, 0.45)}


def _relative_errors(model, gpu_type):
    p = load_placements(model, gpu_type)
    fit = fit_perf_params(p.num_nodes, p.num_replicas, p.local_bsz, p.step_time - p.sync_time,
                          p.step_time)
    pred = sync_time(fit, p.num_nodes, p.num_replicas, p.local_bsz)
    return np.abs(pred / p.step_time - 1)


@pytest.mark.parametrize("gpu_type", TYPES)
@pytest.mark.parametrize("model", MODELS)
def test_fit_reproduces_measured_step_times(model, gpu_type):
    rel = _relative_errors(model, gpu_type)
    med_bound, p90_bound = LOOSER.get((model, gpu_type), (0.10, 0.25))
    assert np.median(rel) <= med_bound
    assert np.quantile(rel, 0.9) <= p90_bound


def test_pooled_fit_error():
    rel = np.concatenate([_relative_errors(m, t) for m in MODELS for t in TYPES])
    assert np.median(rel) <= 0.07
    assert np.quantile(rel, 0.9) <= 0.20
