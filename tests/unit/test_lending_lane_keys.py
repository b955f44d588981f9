"""One key per model and lane (issue 8 item 1): an image model's request samples, the cost fit made
of them, its queue stats and the master's facts are all keyed by its *image ID*, the ID its
image-lane links name, so the planner finds its fit and prices it.

Before, samples were recorded under the local ID while links and queue stats used the image ID, so
an image owner was never priced (every plan row ``owner_unpriced``, one-request probes only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from routerd.catalog.model import Capabilities, ModelConfig
from routerd.config.lending import LendingSettings
from routerd.lending.links import LinkSet
from routerd.lending.planner import ModelFacts, plan
from routerd.wire.lending import (
    Costs,
    Endpoint,
    LaneStatus,
    Link,
    ModelCost,
    QueueStat,
    from_json,
    lane_key,
    lane_model_id,
    section_key,
)
from routerd.wire.status import RuntimeStatus
from tests.unit.node_fixture import IMAGE, TEXT, TOKEN, World

#: 20 ms per step-megapixel: a 20-step 512×512 job takes about 105 simulated ms.
PAINT: dict[str, Any] = {**IMAGE, "ms_per_step_megapixel": 20, "load_ms": 50}
#: Image models run at simulated speed (the fixture's default time scale 0 would make every
#: sample last 0 ms, which no fit accepts); text models stay instant.
TIMED_IMAGES: dict[str, Any] = {"extra_args": []}
JOB = {"model": "paint-paint", "prompt": "a lighthouse", "size": "512x512", "steps": 20}
SETTINGS = {"scheduling_min_samples": 2, "scheduling_refresh_interval": "1s", "token": TOKEN}


def model(local_id: str, *, image_id: str | None = None, llm: bool = False,
          image: bool = False) -> ModelConfig:
    return ModelConfig(local_id=local_id, filename=f"{local_id}.kcpps", path=f"/m/{local_id}.kcpps",
                       backend_mode="llama_sdcpp", image_id=image_id,
                       capabilities=Capabilities(llm=llm, image=image, context=4096 if llm else 0),
                       config_hash=f"cfg-{local_id}")


def test_lane_key_is_the_image_id_in_the_image_lane_and_the_local_id_elsewhere() -> None:
    paint = model("paint", image_id="paint-sd15", image=True)
    chat = model("chat", llm=True)
    assert lane_key("image", paint) == lane_model_id("image", paint) == "paint-sd15"
    assert lane_key("text", chat) == lane_model_id("text", chat) == "chat"
    assert lane_key(None, paint) == "paint"  # a route that is never lent: the local ID
    assert lane_key("text", paint) == "paint"  # a lane the model does not serve: the local ID
    assert section_key("image", paint) == "paint-sd15"
    assert section_key("llm", chat) == "chat"
    assert section_key("stt", paint) == "paint"  # unpriced sections keep the local ID


def test_an_image_request_is_sampled_and_fitted_under_the_image_id_its_links_name(tmp_path: Path) -> None:
    world = World(tmp_path)
    node = world.node("solo", {"paint": PAINT, "chat": TEXT}, sdcpp=TIMED_IMAGES, cluster=SETTINGS)
    world.start(node)
    for _ in range(3):
        response, body = world.call("POST", node, "/v1/images/generations", json=JOB)
        assert response.code == 200, body
    world.call("POST", node, "/v1/chat/completions",
               json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})

    images = world.run(world.stores["solo"].request_samples(None, "image", 0))
    assert {s.model_id for s in images} == {"paint-paint"}
    texts = world.run(world.stores["solo"].request_samples(None, "llm", 0))
    assert {s.model_id for s in texts} == {"chat"}  # the text lane keeps the local ID

    world.clock.advance(1.0)  # the refit loop runs every scheduling_refresh_interval
    response, body = world.call("GET", node, "/router/v1/node/runtime-status",
                                headers={"authorization": f"Bearer {TOKEN}"})
    assert response.code == 200, body
    costs = from_json(json.loads(body)["costs"], Costs)
    fit = costs.model("paint-paint", "image")
    assert fit is not None and fit.samples == 3 and fit.base_ms > 0
    assert costs.model("paint", "image") is None


def _image_status(node_id: str, costs: Costs, queue: tuple[QueueStat, ...] = (),
                  accepting: bool = False) -> RuntimeStatus:
    return RuntimeStatus(node_id=node_id, idle_for_ms=600_000, costs=costs,
                      lanes={"image": LaneStatus(accepting_borrowed=accepting,
                                                 active_config=f"{node_id}.kcpps", queue=queue)})


def test_an_image_owner_whose_fit_is_keyed_by_its_image_id_is_priced_and_granted() -> None:
    """The planner side of the same key: queue stats, facts, links and fits all under image IDs."""
    owner_fit = ModelCost(model_id="own-sd", section="image", base_ms=100.0, slopes_ms=(0.0,), samples=3,
                          uniform_work=(5_242_880.0,))
    helper_fit = ModelCost(model_id="help-sd", section="image", base_ms=100.0, slopes_ms=(0.0,), samples=3,
                           uniform_work=(5_242_880.0,))
    queue = (QueueStat(model_id="own-sd", pending_count=8, pending_work=(8 * 5_242_880.0,),
                       backlog_count=10, backlog_work=(10 * 5_242_880.0,)),)
    statuses = {"owner": _image_status("owner", Costs(models=(owner_fit,)), queue),
                "helper": _image_status("helper", Costs(models=(helper_fit,)), accepting=True)}
    link = Link(Endpoint("owner", "own-sd"), Endpoint("helper", "help-sd"))
    links = {"image": LinkSet.build("image", [link]), "text": LinkSet.build("text", ())}
    facts = {("image", "owner", "own-sd"): ModelFacts("owner.kcpps"),
             ("image", "helper", "help-sd"): ModelFacts("helper.kcpps")}
    result = plan("enqueued", 0, links.values(), statuses, LendingSettings(), facts)
    assert [(r.outcome, r.reason) for r in result.rows] == [("granted", None)]
    assert [lease.helper_model_id for lease in result.leases] == ["help-sd"]
