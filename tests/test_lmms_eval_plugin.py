"""The lmms-eval plugin, resolved through lmms-eval's own registry from our entry point.

lmms-eval's interface modules are installed without their heavy dependencies
(requirements-plugin-test.txt), so this runs lmms-eval's real ``get_model`` and base class.
"""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from llava_norm.inference import Predictor, Prompt
from llava_norm.model.builder import ModelSpec, build_model, load_bundle

lmms_models = pytest.importorskip("lmms_eval.models", reason="install requirements-plugin-test.txt (make install does)")
import lmms_eval  # noqa: E402
from lmms_eval.api.instance import Instance  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("plugin") / "ckpt"
    build_model(ModelSpec(f"{tiny_dir}/siglip", f"{tiny_dir}/qwen2", norm_alignment="ln_textnorm_gwc")).save(out)
    return out


def _instance(kind, args, doc_id):
    return Instance(request_type=kind, arguments=args, idx=0,
                    metadata={"task": "t", "doc_id": doc_id, "repeats": 1})


def test_lmms_eval_resolves_and_runs_the_llava_norm_model(checkpoint):
    cls = lmms_models.get_model("llava_norm")
    model = cls.create_from_arg_string(f"pretrained={checkpoint}", {"batch_size": 2, "device": "cpu"})
    docs = [{"image": Image.new("RGB", (64, 64), colour), "q": f"What colour is it? ({colour})"}
            for colour in ("red", "blue", "green")]
    model.task_dict = {"t": {"test": docs}}
    requests = [_instance("generate_until", (d["q"], {"max_new_tokens": 6, "until": ["\n\n"]},
                                             lambda doc: [doc["image"]], i, "t", "test"), i)
                for i, d in enumerate(docs)]
    replies = model.generate_until(requests)

    reference = Predictor(load_bundle(checkpoint))
    expected = reference.generate([Prompt(d["q"], d["image"]) for d in docs], max_new_tokens=6)
    assert replies == [r.split("\n\n")[0] for r in expected]
    # a stop string the reply holds (the tiny model never writes "\n\n"): the reply ends before it
    full = expected[0]
    stop = full[len(full) // 2:len(full) // 2 + 2]
    assert len(stop) == 2 and full.index(stop) > 0, full
    cut = model.generate_until([_instance("generate_until", (docs[0]["q"], {"max_new_tokens": 6, "until": [stop]},
                                                             lambda doc: [doc["image"]], 0, "t", "test"), 0)])
    assert cut == [full[:full.index(stop)]], (cut, full, stop)
    # stop_at_until=false: the reply whole, as lmms-eval's llava wrapper and llava-norm eval give it
    whole = cls.create_from_arg_string(f"pretrained={checkpoint},stop_at_until=false", {"batch_size": 2, "device": "cpu"})
    whole.task_dict = model.task_dict
    assert whole.generate_until([_instance("generate_until", (docs[0]["q"], {"max_new_tokens": 6, "until": [stop]},
                                                              lambda doc: [doc["image"]], 0, "t", "test"), 0)]) == [full]
    with pytest.raises(ValueError, match=r"stop_at_until='flase'; give true or false"):  # not read as false
        cls.create_from_arg_string(f"pretrained={checkpoint},stop_at_until=flase", {"batch_size": 2, "device": "cpu"})
    # What the README says of the lmms-eval pinned here (requirements-plugin-test.txt), read from its
    # source (its task module needs packages this project does not install): a task naming no
    # `until` gets its few-shot delimiter, "\n\n" by default; its own llava wrapper's cut at
    # `until` is commented out, so it keeps replies whole
    source = (Path(lmms_eval.__file__).parent / "api/task.py").read_text()
    assert 'fewshot_delimiter: str = "\\n\\n"' in source
    assert 'self.generation_kwargs["until"] = [self.fewshot_delimiter]' in source
    wrapper = (Path(lmms_eval.__file__).parent / "models/simple/llava.py").read_text().splitlines()
    cuts = [line.strip() for line in wrapper if "for term in until" in line]
    assert cuts and all(line.startswith("#") for line in cuts), cuts

    # lmms-eval picks a multiple-choice answer by the smallest value (its wrappers return a loss):
    # the plugin returns the negative log-likelihood, so the most likely choice is picked
    assert "pred = np.argmin(lls)" in (Path(lmms_eval.__file__).parent / "api/task.py").read_text()
    choices = [" blue", " under the seventh sea of the moon"]
    ll = model.loglikelihood([_instance("loglikelihood", ("The sky is", c, lambda doc: [], 0, "t", "test"), i)
                              for i, c in enumerate(choices)])
    expected = reference.loglikelihood([("The sky is", c) for c in choices])
    assert [score for score, _ in ll] == pytest.approx([-lp for lp in expected], abs=1e-5)
    assert np.argmin([score for score, _ in ll]) == np.argmax(expected) and expected[0] != expected[1]
    assert all(isinstance(greedy, bool) for _, greedy in ll)
