"""Presets (shipped and from a file) and the mapping of Ray actors to (job, role, rank)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from integrations.ray.mapping import map_actors
from integrations.ray.presets import PresetError, load_preset, preset_from_dict, with_resume
from integrations.ray.state import ActorRecord, JobRecord, actor_from_dict


def actor(
    aid: str, cls: str, name: str = "", job: str = "01000000", state: str = "ALIVE"
) -> ActorRecord:
    return ActorRecord(aid, cls, state, job, name, "n1", 100, 0, None, None)


def test_verl_preset_maps_its_worker_classes_and_ranks_from_names() -> None:
    actors = [
        actor("a3", "WorkerDict", "xyzWorkerDict_0:1"),
        actor("a1", "WorkerDict", "xyzWorkerDict_0:0"),
        actor("a2", "WorkerDict", "xyzWorkerDict_1:0"),
        actor("s1", "vLLMHttpServer", "vllm_server_1_0"),
        actor("s0", "SGLangHttpServer", "sglang_server_0_0"),
        actor("r0", "vLLMHttpServer", "vllm_server_reward_0_0"),
        actor("c0", "CriticWorker", "xyzCriticWorker_0:0"),
        actor("u0", "MyCustomThing", "thing"),
    ]
    mapped = map_actors(actors, load_preset("verl"), job_name="job-v")
    got = {(m.actor.actor_id): (m.role, m.rank) for m in mapped.actors}
    assert (
        got["a1"] == ("trainer", 0) and got["a3"] == ("trainer", 1) and got["a2"] == ("trainer", 2)
    )
    assert got["s1"] == ("rollout", 1) and got["s0"] == ("rollout", 0)
    assert got["r0"][0] == "reward" and got["c0"] == ("critic", 0)
    fused = map_actors(
        [actor("f0", "FusedWorker_Actor_Critic", "xyzFusedWorker_Actor_Critic_0:0")],
        load_preset("verl"),
        job_name="job-v",
    )
    assert [(m.role, m.rank) for m in fused.actors] == [("trainer", 0)]
    assert mapped.unmatched == {"MyCustomThing"}
    assert {m.job for m in mapped.actors} == {"job-v"}


def test_openrlhf_preset_and_job_names_from_rays_jobs() -> None:
    actors = [
        actor("b", "PolicyModelActor", job="02000000"),
        actor("a", "PolicyModelActor", job="02000000"),
        actor("v", "RolloutRayActor", job="02000000"),
        actor("r", "ReferenceModelActor", job="03000000"),
    ]
    jobs = [
        JobRecord("02000000", "raysubmit_1", "RUNNING", "python -m x", {"rlguard_job": "orl-7b"}),
        JobRecord("03000000", None, "RUNNING", "python y.py", {}),
    ]
    mapped = map_actors(actors, load_preset("openrlhf"), jobs)
    got = {m.actor.actor_id: (m.job, m.role, m.rank) for m in mapped.actors}
    assert got == {
        "a": ("orl-7b", "trainer", 0),
        "b": ("orl-7b", "trainer", 1),
        "v": ("orl-7b", "rollout", 0),
        "r": ("ray-03000000", "reference", 0),
    }


def test_a_preset_file_in_yaml_or_json(tmp_path: Path) -> None:
    doc = {
        "name": "mine",
        "roles": [
            {"role": "trainer", "class": "^T$"},
            {"role": "rollout", "class": "^E$", "name": r"^e_(?P<rank>\d+)$"},
        ],
        "resume": ["--resume"],
    }
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    preset = load_preset(str(path))
    assert preset.resume_args == ("--resume",)
    mapped = map_actors([actor("x", "E", "e_4"), actor("y", "T")], preset, job_name="j")
    assert sorted((m.role, m.rank) for m in mapped.actors) == [("rollout", 4), ("trainer", 0)]
    yml = tmp_path / "p.yaml"
    yml.write_text("name: y\nroles:\n  - {role: trainer, class: '^T$'}\n")
    assert load_preset(str(yml)).rules[0].role == "trainer"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"roles": []}, "'roles' must be a non-empty list"),
        ({"roles": [{"role": "t r", "class": "x"}]}, "role 't r' is not a valid role name"),
        ({"roles": [{"role": "t", "class": "("}]}, "class '(' is not a regular expression"),
        ({"roles": [{"role": "t", "klass": "x"}]}, "unknown key 'klass'"),
        ({"roles": [{"role": "t", "class": "x"}], "other": 1}, "unknown key 'other'"),
        ({"roles": [{"role": "t", "class": "x"}], "resume": "--r"}, "'resume' must be a list"),
    ],
)
def test_bad_preset_files_are_named(tmp_path: Path, doc: dict, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PresetError, match=message.replace("(", r"\(").replace("'", "'")):
        load_preset(str(path))


def test_preset_patterns_run_on_re2(tmp_path: Path) -> None:
    # A lookahead is refused by name; a nested quantifier against a long actor name answers
    # (Python's backtracking engine would need 2^200 steps for it).
    path = tmp_path / "lookahead.json"
    path.write_text(json.dumps({"roles": [{"role": "t", "class": "^(?!Ref)Worker"}]}))
    with pytest.raises(PresetError) as err:
        load_preset(str(path))
    assert "class '^(?!Ref)Worker'" in str(err.value)
    assert "uses a negative lookahead (?!...)" in str(err.value)
    nested = preset_from_dict({"roles": [{"role": "t", "class": "^(W+)+$"}]}, "nested")
    assert nested.role_of("W" * 200 + "x", "") is None
    assert nested.role_of("W" * 200, "") == ("t", {})


def test_unknown_preset_and_unreadable_file_are_named(tmp_path: Path) -> None:
    with pytest.raises(PresetError, match="unknown Ray preset 'deepspeed'.*verl"):
        load_preset("deepspeed")
    broken = tmp_path / "broken.yaml"
    broken.write_text("roles: [\n")
    with pytest.raises(PresetError, match="broken.yaml"):
        load_preset(str(broken))


def test_resume_arguments_replace_a_given_key_and_add_a_flag_once() -> None:
    verl = load_preset("verl").resume_args
    assert with_resume(
        "python3 -m verl.trainer.main_ppo trainer.resume_mode=disable a=1", verl
    ) == ("python3 -m verl.trainer.main_ppo a=1 trainer.resume_mode=auto")
    orl = load_preset("openrlhf").resume_args
    once = with_resume("python -m openrlhf.cli.train_ppo_ray --ckpt.path /c", orl)
    assert once.endswith("--ckpt.path /c --ckpt.load_enable")
    assert with_resume(once, orl) == once


def test_the_reference_jobs_resume_option_replaces_either_spelling_once() -> None:
    from workload.ray_mode import rlguard_preset

    ref = preset_from_dict(rlguard_preset("ref-job"), "reference").resume_args
    launch = "python -m workload.launch --run-dir /r --ray"
    for given in ("", " --resume disable", " --resume=disable", " --resume=auto"):
        resumed = with_resume(launch + given + " --steps 4", ref)
        assert resumed == launch + " --steps 4 --resume=auto", given
        assert with_resume(resumed, ref) == resumed
    # Only the option itself is replaced, not one whose name starts the same.
    assert with_resume("x --resume-dir d", ref) == "x --resume-dir d --resume=auto"


def test_death_cause_from_rays_record() -> None:
    rec = actor_from_dict(
        {
            "actor_id": "ab",
            "class_name": "WorkerDict",
            "state": "DEAD",
            "job_id": "01000000",
            "name": "",
            "node_id": "n",
            "pid": 42,
            "num_restarts": 2,
            "ray_namespace": "ns",
            "death_cause": {
                "actor_died_error_context": {"reason": "NODE_DIED", "error_message": "gone"}
            },
        }
    )
    assert (rec.death_reason, rec.death_message, rec.num_restarts, rec.namespace) == (
        "NODE_DIED",
        "gone",
        2,
        "ns",
    )
    oom = actor_from_dict({"actor_id": "c", "death_cause": {"oom_context": {"error_message": "m"}}})
    assert oom.death_reason == "OOM"


def test_actors_of_a_job_that_was_resubmitted_are_left_out() -> None:
    old = actor("a", "WorkerDict", "xWorkerDict_0:0", job="02000000", state="DEAD")
    new = actor("b", "WorkerDict", "xWorkerDict_0:0", job="05000000")
    jobs = [
        JobRecord("02000000", "s1", "FAILED", "python m.py", {"rlguard_job": "v"}),
        JobRecord(
            "05000000",
            "s2",
            "RUNNING",
            "python m.py trainer.resume_mode=auto",
            {"rlguard_job": "v"},
        ),
    ]
    mapped = map_actors([old, new], load_preset("verl"), jobs, job_name="v")
    assert [(m.actor.actor_id, m.rank) for m in mapped.actors] == [("b", 0)]
    # without a running successor the failed job's dead actor stays a participant, also when a
    # plain driver (not a Jobs API submission) runs on the cluster
    driver = JobRecord("01000000", None, "RUNNING", "python notebook.py", {})
    mapped = map_actors([old], load_preset("verl"), [jobs[0], driver], job_name="v")
    assert [m.actor.actor_id for m in mapped.actors] == ["a"]


def test_a_dead_actor_created_again_under_its_name_is_left_out() -> None:
    # integrations.ray.restarter: the job created rollout 1 again; the dead one keeps its record.
    preset = preset_from_dict(
        {
            "name": "p",
            "roles": [{"role": "rollout", "class": "^W$", "name": r"^j_rollout_(?P<rank>\d+)$"}],
        },
        "p",
    )
    dead = actor("a", "W", "j_rollout_1", state="DEAD")
    new = actor("b", "W", "j_rollout_1")
    other_dead = actor("c", "W", "j_rollout_0", state="DEAD")
    mapped = map_actors([dead, new, other_dead], preset, job_name="j")
    assert sorted((m.actor.actor_id, m.rank) for m in mapped.actors) == [("b", 1), ("c", 0)]
    # until the new one exists, the dead one is the participant (its death is the incident)
    assert [m.actor.actor_id for m in map_actors([dead], preset, job_name="j").actors] == ["a"]


def test_an_actor_still_being_created_replaces_nobody() -> None:
    # A restarter's warm standby waits in its creation (PENDING_CREATION) under the next name
    # of a rank: beside a live actor it is left out, beside a dead one the dead one stays the
    # participant (its death is the incident RLGuard must see), alone it is the one starting.
    preset = preset_from_dict(
        {
            "name": "p",
            "roles": [
                {"role": "rollout", "class": "^W$", "name": r"^j_rollout_(?P<rank>\d+)(_r\d+)?$"}
            ],
        },
        "p",
    )
    live = actor("a", "W", "j_rollout_0")
    dead = actor("a", "W", "j_rollout_0", state="DEAD")
    standby = actor("s", "W", "j_rollout_0_r1", state="PENDING_CREATION")
    unready = actor("u", "W", "j_rollout_0_r1", state="DEPENDENCIES_UNREADY")

    def ids(*actors: ActorRecord) -> list[str]:
        return [m.actor.actor_id for m in map_actors(list(actors), preset, job_name="j").actors]

    assert ids(live, standby) == ["a"]
    assert ids(standby, dead) == ["a"]
    assert ids(dead, unready) == ["a"]
    assert ids(standby) == ["s"]
    activated = actor("s", "W", "j_rollout_0_r1", state="ALIVE")
    assert ids(dead, activated) == ["s"]


def test_an_earlier_run_of_the_same_job_gives_way_to_the_running_one() -> None:
    # Two plain drivers of one job name on a long-lived cluster (one job per cluster: job_name):
    # the first run ended, its actors dead with OWNER_DIED; the running one's trainer just died.
    preset = preset_from_dict(
        {
            "name": "p",
            "roles": [{"role": "trainer", "class": "^W$", "name": r"^j_trainer_(?P<rank>\d+)$"}],
        },
        "p",
    )
    old = actor("old", "W", "j_trainer_0", job="01000000", state="DEAD")
    new = actor("new", "W", "j_trainer_0", job="02000000", state="DEAD")
    jobs = [
        JobRecord("01000000", None, "SUCCEEDED", "python run.py", {}),
        JobRecord("02000000", None, "RUNNING", "python run.py", {}),
    ]
    mapped = map_actors([old, new], preset, jobs, job_name="j")
    assert [m.actor.actor_id for m in mapped.actors] == ["new"]
    # With only the ended run's actors, they are the participant still.
    assert [m.actor.actor_id for m in map_actors([old], preset, jobs, job_name="j").actors] == [
        "old"
    ]


def test_rays_own_job_supervisor_actors_are_neither_mapped_nor_unmatched() -> None:
    # Every Jobs API submission starts a JobSupervisor actor in Ray's supervisor namespace; it
    # is no worker of the job and must not be reported as an unknown class either.
    supervisor = ActorRecord(
        "js",
        "JobSupervisor",
        "DEAD",
        "02000000",
        "_ray_internal_job_actor_x",
        "n1",
        101,
        0,
        None,
        None,
        namespace="SUPERVISOR_ACTOR_RAY_NAMESPACE",
    )
    worker = actor("a0", "WorkerDict", "xyzWorkerDict_0:0")
    mapped = map_actors([supervisor, worker], load_preset("verl"), job_name="job-v")
    assert [m.actor.actor_id for m in mapped.actors] == ["a0"]
    assert mapped.unmatched == set()
