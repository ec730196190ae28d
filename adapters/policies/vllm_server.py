"""The vLLM server backend: `VLLMServerPolicy` over `vllm serve`, with weight sync to the running server.

Generation goes through the OpenAI-compatible `POST /v1/completions` (OpenAIPolicy's client:
round-robin base URLs, timeouts, retries, `EndpointError`), with the prompt given as the token
ids `chat_template.encode_prompt` renders, as the in-process vllm backend does, so the server
samples after exactly the tokens the trainer scores; `return_token_ids` and `logprobs=0` bring
back the sampled ids and their logprobs (the model's own, before temperature and filters).

`update_weights(state_dict)` uses vLLM's own in-place reload, reached over HTTP: the state dict
is written as one safetensors file into `weights_dir`, then every server gets
`POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": weights_dir}}` (the
workers' `reload_weights`, as `LLM.collective_rpc` calls it in process) and
`POST /reset_prefix_cache`. Both are vLLM's development endpoints: the server runs with
`VLLM_SERVER_DEV_MODE=1`, and `weights_dir` must be a path the server reads (the same machine, or
a shared file system). vLLM's NCCL and CUDA-IPC weight-transfer engines (`/update_weights`) need
GPUs; this route works on a CPU too. Every call has a timeout; a failed or late sync raises
WeightSyncError naming the server and the step that failed.

`VLLMServer` starts `vllm serve` itself (a subprocess on 127.0.0.1 at a free port, health-checked,
stopped by `close()` or at exit); the spec `vllm-server:PATH` uses one, the spec
`vllm-server:URL[,URL...]#MODEL` a server already running.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterable, Sequence
from copy import deepcopy
from pathlib import Path
from typing import Any

from pivot_envs.adapters import chat_template
from pivot_envs.adapters.policies.openai import EndpointError, OpenAIPolicy, sampling_fields
from pivot_envs.adapters.policies.vllm import VLLMPolicy, trainable_checkpoint
from pivot_envs.errors import PivotEnvsError
from pivot_envs.policy import Completion, PolicySpecError, SamplingParams


class WeightSyncError(PivotEnvsError, RuntimeError):
    """Trained weights did not reach a vLLM server: it is down, refused them, or did not answer in time."""

    def __init__(self, message: str, url: str = "") -> None:
        super().__init__(message)
        self.url = url


class ServerStartError(PivotEnvsError, RuntimeError):
    """A `vllm serve` process exited, or did not answer /health, before its start timeout."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class VLLMServer:
    """`vllm serve MODEL` as a subprocess on 127.0.0.1, with its development endpoints on.

    model:          checkpoint directory or hub name ("smollm2": the embedded checkpoint).
    port:           None: a free one.
    dtype, gpu_memory_utilization, max_model_len, seed: as `vllm serve` takes them (dtype None:
                    float32 on a CPU, auto on a GPU).
    start_timeout:  seconds for the server to answer GET /health; past them, or if it exits,
                    ServerStartError with the end of its log.
    server_args:    further `vllm serve` arguments.
    environment:    further environment variables for the server.

    The server samples without the checkpoint's generation_config defaults (`--generation-config
    vllm`), so requests mean what they say. On a CPU it runs eager, with whole prefills and a
    1 GiB KV cache, as the in-process backend does. `base_url` is its address; the log is
    `log_path`. `close()` stops it (terminate, then kill after 10 s); so does interpreter exit, and
    on Linux the death of the thread that started it, however it dies (start it from a thread that
    outlives its use: the main thread).
    """

    def __init__(
        self,
        model: str,
        port: int | None = None,
        served_model_name: str | None = None,
        dtype: str | None = None,
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        seed: int = 0,
        start_timeout: float = 300.0,
        server_args: Sequence[str] = (),
        environment: dict[str, str] | None = None,
    ) -> None:
        import torch

        on_cpu = not torch.cuda.is_available()
        if model == "smollm2":
            from pivot_envs.adapters import smollm2

            model = str(smollm2.checkpoint())
        self.model = model
        self.max_model_len = max_model_len or None
        self.served_model_name = served_model_name or Path(model).name
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
        command += [
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--served-model-name",
            self.served_model_name,
        ]
        command += ["--dtype", dtype or ("float32" if on_cpu else "auto"), "--seed", str(seed)]
        command += ["--gpu-memory-utilization", str(gpu_memory_utilization), "--generation-config", "vllm"]
        command += ["--enable-prefix-caching"]
        if max_model_len:
            command += ["--max-model-len", str(max_model_len)]
        if (
            on_cpu
        ):  # as VLLMPolicy: no torch.compile (minutes), whole prefills (seeded chunked ones crash 0.32)
            command += ["--enforce-eager", "--no-enable-chunked-prefill"]
        command += list(server_args)
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", **(environment or {})}
        if on_cpu:
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        self.workdir = Path(tempfile.mkdtemp(prefix="pivot-vllm-server-"))
        self.log_path = self.workdir / "server.log"
        with self.log_path.open("wb") as log:
            # Its own process group, so close() stops the engine processes it spawns too.
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        self._finalizer = weakref.finalize(self, _stop, self.process, self.workdir)
        try:
            self.wait_healthy(start_timeout)
        except BaseException:
            self.close()
            raise

    def wait_healthy(self, timeout: float) -> None:
        """Return when GET /health answers 200; ServerStartError if the process exits or `timeout` passes."""
        import requests

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"vllm serve {self.model} exited with code {self.process.returncode} before it was "
                    f"healthy; the end of its log ({self.log_path}):\n{self.log_tail()}"
                )
            try:
                if requests.get(f"{self.base_url}/health", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass  # not listening yet
            time.sleep(1.0)
        raise ServerStartError(
            f"vllm serve {self.model} at {self.base_url} was not healthy within {timeout:.0f}s; "
            f"the end of its log:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 30) -> str:
        """The last `lines` lines of the server's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def close(self) -> None:
        """Stop the server and remove its working directory (idempotent)."""
        self._finalizer()

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _die_with_parent() -> None:
    """In the server's process before exec: SIGTERM it when this process dies, even by SIGKILL (Linux)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM


def _stop(process: subprocess.Popen, workdir: Path) -> None:
    if process.poll() is None:
        os.killpg(process.pid, 15)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(timeout=10)
    shutil.rmtree(workdir, ignore_errors=True)


class VLLMServerPolicy(OpenAIPolicy):
    """Models served by `vllm serve` (one or several replicas of one model), as a trainable Policy.

    base_urls:         the servers' base URLs (with or without /v1), used round-robin.
    model:             the served model name.
    checkpoint:        the served checkpoint (directory or hub name), loaded locally for the
                       tokenizer and `trainable_model()`; default `model`.
    weights_dir:       where `update_weights` writes the weights for the servers to read; default
                       a fresh directory in /dev/shm (else the temp directory), which only a server
                       on this machine can read.
    sync_timeout:      seconds a server may take to load new weights.
    max_prompt_tokens: fit longer prompts to this many tokens (`chat_template.fit_prompt`).
    context_window:    the served context in tokens (default: the owned server's max_model_len,
                       else the checkpoint config's max_position_embeddings): prompts are fitted to it
                       less the `max_new_tokens` sampled after them (`chat_template.PromptFitter`).
    ignore_eos:        sample `max_new_tokens` tokens every time (benchmarks).
    server:            a VLLMServer this policy owns: `close()` stops it.
    client_options:    OpenAIPolicy's (timeout, max_retries, backoff, concurrency, api_key).
    """

    def __init__(
        self,
        base_urls: str | Sequence[str],
        model: str,
        checkpoint: str | None = None,
        weights_dir: str | None = None,
        sync_timeout: float = 600.0,
        max_prompt_tokens: int | None = None,
        ignore_eos: bool = False,
        server: VLLMServer | None = None,
        name: str | None = None,
        context_window: int | None = None,
        **client_options: Any,
    ) -> None:
        from transformers import AutoConfig, AutoTokenizer

        super().__init__(base_urls, model, name=name or f"vllm-server:{model}", **client_options)
        self.roots = [url.removesuffix("/v1/chat/completions") for url in self.endpoints]
        self.endpoints = [root + "/v1/completions" for root in self.roots]
        if checkpoint is None and model == "smollm2":
            from pivot_envs.adapters import smollm2

            checkpoint = str(smollm2.checkpoint())
        self.path = checkpoint or model
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self.sync_timeout = sync_timeout
        # Seconds the client waits past sync_timeout, so the server's own timeout error can arrive.
        self.sync_margin = 5.0
        self.max_prompt_tokens = max_prompt_tokens or None
        self.ignore_eos = ignore_eos
        self.server = server
        if context_window is None and server is not None:
            context_window = server.max_model_len
        if context_window is None:  # vLLM serves the checkpoint's own context unless told --max-model-len
            context_window = chat_template.context_window(
                AutoConfig.from_pretrained(self.path), self.tokenizer
            )
        self.context_window = context_window
        self.fitter = chat_template.PromptFitter(self.name, context_window, self.max_prompt_tokens)
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.weights_dir = Path(weights_dir or tempfile.mkdtemp(prefix="pivot-weights-", dir=shm))
        # A directory made here goes with the policy (close(), or collection, or exit): /dev/shm is memory.
        self._remove_weights = (
            weakref.finalize(self, shutil.rmtree, self.weights_dir, ignore_errors=True)
            if weights_dir is None
            else lambda: None
        )
        self.last_sync_s = 0.0  # seconds the last update_weights took

    encode = VLLMPolicy.encode  # the same fitted token ids as the in-process engine

    def generate(
        self, chats: Sequence[dict[str, Any]], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        """n completions per chat (OpenAIPolicy's concurrent requests), every prompt fitted before the first."""
        prompts = self.fitter.encode(self.tokenizer, chats, max(sampling.max_new_tokens, 0))
        return super().generate(
            [{**chat, "prompt_token_ids": ids} for chat, ids in zip(chats, prompts)], n, sampling
        )

    def completions_body(self, prompt: list[int], n: int, sampling: SamplingParams) -> dict[str, Any]:
        """The JSON body of one `/v1/completions` request for n samples after the token ids `prompt`."""
        body = {"model": self.model, "prompt": prompt, "n": n, **sampling_fields(sampling)}
        # Sent even at their defaults: a server started without --generation-config vllm has the checkpoint's.
        body.update(top_k=sampling.top_k, min_p=sampling.min_p, stop=list(sampling.stop or []))
        body.update(logprobs=0, return_token_ids=True, ignore_eos=self.ignore_eos)
        return body

    def _generate_one(self, chat: dict[str, Any], n: int, sampling: SamplingParams) -> list[Completion]:
        prompt = chat.get("prompt_token_ids") or self.encode(chat, max(sampling.max_new_tokens, 0))
        distinct = 1 if sampling.temperature <= 0 else n  # vLLM refuses greedy n > 1
        choices = self.choices(self.completions_body(prompt, distinct, sampling), distinct)
        group = [_completion(choice, prompt, self.endpoints[0]) for choice in choices]
        return group + [deepcopy(group[0]) for _ in range(n - distinct)]

    def choices(self, body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        """POST a completions body; its n choices in index order (EndpointError if fewer come back)."""
        choices = sorted(self.post(body).get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != n:
            raise EndpointError(f"{self.endpoints[0]}: asked for n={n} choices, got {len(choices)}")
        return choices

    def sequence_logprobs(self, prompt_token_ids: list[int], token_ids: list[int]) -> list[float]:
        """The served model's logprobs of `token_ids` after `prompt_token_ids` (its prompt logprobs)."""
        body = {"model": self.model, "prompt": list(prompt_token_ids) + list(token_ids), "max_tokens": 1}
        body.update(temperature=0.0, prompt_logprobs=0, return_token_ids=True)
        (choice,) = self.choices(body, 1)
        entries = (choice.get("prompt_logprobs") or [])[len(prompt_token_ids) :]
        return [float(entry[str(token)]["logprob"]) for entry, token in zip(entries, token_ids)]

    def trainable_model(self) -> Any:
        """The served checkpoint as a float32 transformers causal LM, for a trainer to update and hand
        back through `update_weights`."""
        return trainable_checkpoint(self.path)

    def update_weights(self, state_dict: dict[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Load new weights (a transformers state dict of the served architecture) into every server.

        Raises WeightSyncError naming the server and the step when one is down, refuses the
        weights, or takes longer than `sync_timeout`.
        """
        began = time.perf_counter()
        self.write_weights(state_dict)
        for root in self.roots:
            self._admin(
                root,
                "/collective_rpc",
                {
                    "method": "reload_weights",
                    "kwargs": {"weights_path": str(self.weights_dir)},
                    "timeout": self.sync_timeout,
                },
                "reload_weights",
            )
            self._admin(root, "/reset_prefix_cache", None, "reset_prefix_cache")
        self.last_sync_s = time.perf_counter() - began

    def write_weights(self, state_dict: dict[str, Any] | Iterable[tuple[str, Any]]) -> Path:
        """Write the weights as `weights_dir`/model.safetensors (what `reload_weights` reads); returns it.

        Tensors that share storage (tied embeddings) are written as copies: safetensors stores
        no aliases, and vLLM's reload of a tied head takes the head's own entry."""
        from safetensors.torch import save_file

        items = state_dict.items() if isinstance(state_dict, dict) else state_dict
        tensors, seen = {}, set()
        for key, value in items:
            tensor = value.detach().to("cpu").contiguous()
            pointer = tensor.data_ptr()
            tensors[key] = tensor.clone() if pointer in seen else tensor
            seen.add(pointer)
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        path = self.weights_dir / "model.safetensors"
        save_file(tensors, str(path))
        return path

    def _admin(self, root: str, route: str, body: dict[str, Any] | None, step: str) -> None:
        import requests

        url = root + route
        try:
            answer = self._session.post(url, json=body, timeout=self.sync_timeout + self.sync_margin)
        except requests.Timeout:
            raise WeightSyncError(
                f"vLLM server {root}: {step} did not answer within {self.sync_timeout + self.sync_margin:.0f}s",
                root,
            ) from None
        except requests.ConnectionError as error:
            raise WeightSyncError(
                f"vLLM server {root}: {step} failed, the server is unreachable ({type(error).__name__})", root
            ) from None
        if answer.status_code == 404:
            raise WeightSyncError(
                f"vLLM server {root}: {step} failed: POST {route} is 404; start the server with "
                f"VLLM_SERVER_DEV_MODE=1 (vLLM's development endpoints)",
                root,
            )
        if answer.status_code != 200:
            raise WeightSyncError(
                f"vLLM server {root}: {step} failed: HTTP {answer.status_code}: {answer.text[:300]}", root
            )

    def close(self) -> None:
        """Stop the server this policy started (if any) and remove the weights it wrote."""
        if self.server is not None:
            self.server.close()
        self._remove_weights()


def _completion(choice: dict[str, Any], prompt: list[int], endpoint: str) -> Completion:
    token_ids = list(choice.get("token_ids") or [])
    logprobs = [float(value) for value in ((choice.get("logprobs") or {}).get("token_logprobs") or [])]
    if len(logprobs) != len(token_ids):
        raise EndpointError(
            f"{endpoint}: {len(token_ids)} token ids but {len(logprobs)} logprobs (is it vLLM with return_token_ids?)"
        )
    return Completion(
        text=str(choice.get("text") or ""),
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=str(choice.get("finish_reason") or ""),
        prompt_token_ids=list(prompt),
    )


SERVER_OPTIONS = (
    "port",
    "dtype",
    "gpu_memory_utilization",
    "max_model_len",
    "seed",
    "start_timeout",
    "server_args",
    "environment",
)


def from_spec(rest: str, **options: Any) -> VLLMServerPolicy:
    """`vllm-server:BASE_URL[,BASE_URL...]#MODEL` (servers already running) or `vllm-server:PATH` (a
    server started here on 127.0.0.1, stopped by the policy's close()). Options are VLLMServer's for
    a started server, and VLLMServerPolicy's."""
    options.pop("device", None)  # the server places the model
    if not rest:
        raise PolicySpecError(
            "policy spec 'vllm-server:' needs a server or a model: vllm-server:URL#MODEL or vllm-server:PATH"
        )
    if "://" in rest:
        urls, sep, model = rest.rpartition("#")
        if not sep or not urls or not model:
            raise PolicySpecError(
                f"policy spec 'vllm-server:{rest}' must be vllm-server:BASE_URL[,BASE_URL...]#MODEL"
            )
        if options.pop("dtype", None) is not None:
            raise PolicySpecError(
                f"policy spec 'vllm-server:{rest}': a dtype (--dtype) cannot apply to a running server, which "
                "loaded its weights in its own precision; leave it unset, or start one here: vllm-server:PATH"
            )
        return VLLMServerPolicy(urls.split(","), model, **options)
    server = VLLMServer(rest, **{key: options.pop(key) for key in SERVER_OPTIONS if key in options})
    try:
        return VLLMServerPolicy(
            server.base_url,
            server.served_model_name,
            checkpoint=server.model,
            server=server,
            **{"name": f"vllm-server:{rest}", **options},
        )
    except BaseException:
        server.close()
        raise
