"""A backend's own reason for a failure, picked from its last output lines (pure)."""

from __future__ import annotations

from routerd.backends.errors import LoadFailed, exit_reason, own_reason, split_output

#: llama-server b11434 on a GGUF whose tensor data is cut off (its last output lines, as printed).
LLAMA_TRUNCATED = [
    "0.00.010.208 I srv  llama_server: initializing ...",
    "0.00.012.512 W srv  llama_server: security: no API key is set and CORS allows all origins",
    "0.00.017.056 I srv    load_model: loading model '/m/trunc.gguf'",
    "0.00.017.729 E llama_model_load: error loading model: tensor 'blk.0.ffn_gate.weight' data is not within"
    " the file bounds, model is corrupted or incomplete",
    "0.00.017.760 E llama_model_load_from_file_impl: failed to load model",
    "0.00.017.997 E srv    load_model: failed to load model, '/m/trunc.gguf'",
    "0.00.018.000 I srv    operator(): operator(): cleaning up before exit...",
    "0.00.018.528 E srv  llama_server: exiting due to model loading error",
]
#: whisper-server 1.8.5 on a file that is no whisper model.
WHISPER_BAD_MAGIC = [
    "whisper_init_with_params_no_state: flash attn = 1",
    "whisper_init_with_params_no_state: backends   = 1",
    "whisper_model_load: loading model",
    "whisper_model_load: invalid model data (bad magic)",
    "whisper_init_with_params_no_state: failed to load model",
    "error: failed to initialize whisper context",
]


def test_llama_servers_own_reason_is_its_first_error_line_without_time_and_level() -> None:
    assert own_reason(LLAMA_TRUNCATED) == (
        "llama_model_load: error loading model: tensor 'blk.0.ffn_gate.weight' data is not within the file"
        " bounds, model is corrupted or incomplete")


def test_a_levelled_line_that_is_no_error_is_not_the_reason_whatever_it_says() -> None:
    lines = ["0.00.001.000 W srv  warming up: invalid sampler chain, using the default",
             "0.00.002.000 E srv  load_model: failed to load model, '/m/x.gguf'"]
    assert own_reason(lines) == "srv  load_model: failed to load model, '/m/x.gguf'"


def test_llama_servers_levels_are_read_without_timestamps_too() -> None:
    lines = ["I srv    load_model: loading model '/m/x.gguf'",
             "E llama_model_load: error loading model: unknown model architecture: 'x'"]
    assert own_reason(lines) == "llama_model_load: error loading model: unknown model architecture: 'x'"


def test_an_unlevelled_backends_reason_is_its_first_line_saying_something_went_wrong() -> None:
    assert own_reason(WHISPER_BAD_MAGIC) == "whisper_model_load: invalid model data (bad magic)"
    assert own_reason(["starting", "error: llama-server: failed to load model: no such file"]) == (
        "error: llama-server: failed to load model: no such file")


def test_output_without_a_complaint_has_no_own_reason() -> None:
    assert own_reason([]) is None
    assert own_reason(["0.00.001.000 I srv  load_model: loading model 'x'", "Segmentation fault"]) is None


def test_an_exit_reason_leads_with_the_backends_own_words_and_keeps_the_output_lines() -> None:
    exited = "exited with exit code 1 during the load"
    reason = exit_reason("llama-server for 'chat'", exited, LLAMA_TRUNCATED)
    message, tail = split_output(reason)
    assert message == ("llama-server for 'chat': llama_model_load: error loading model: tensor "
                       "'blk.0.ffn_gate.weight' data is not within the file bounds, model is corrupted or "
                       "incomplete (exited with exit code 1 during the load)")
    assert tail == LLAMA_TRUNCATED


def test_an_exit_reason_without_own_words_says_how_the_process_ended() -> None:
    assert exit_reason("llama-server for 'chat'", "exited with signal 9", ["Killed"]) == (
        "llama-server for 'chat' exited with signal 9; last output:\nKilled")
    assert exit_reason("llama-server for 'chat'", "exited with exit code 1", []) == (
        "llama-server for 'chat' exited with exit code 1")


def test_a_failed_load_as_text_is_its_reason_without_the_output_lines_it_keeps() -> None:
    failed = LoadFailed(exit_reason("llama-server for 'chat'", "exited with exit code 1", LLAMA_TRUNCATED))
    assert str(failed) == split_output(failed.reason)[0]
    assert str(failed).startswith("llama-server for 'chat': llama_model_load: error loading model: ")
    assert split_output(failed.reason)[1] == LLAMA_TRUNCATED
    assert str(LoadFailed("model 'x' does not serve stt")) == "model 'x' does not serve stt"
