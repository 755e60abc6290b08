"""vLLM-style argv parsing for the simulator (pure: argv in, SimArgs or ArgvError out).

We do not use argparse: vLLM's FlexibleArgumentParser accepts dotted config keys
(`-cc.cudagraph_mode=X`), `-O3` and underscores, and the simulator must also accept flags it
has never heard of (vLLM has hundreds) and list them in `non-default args`. Errors reproduce
the text vLLM prints, because the tuner's fail-fast detector is tested against it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

USAGE = "usage: vllm serve [model_tag] [options]"
PROG = "vllm serve"

CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
CUDAGRAPH_MODE_BY_INT = {0: "NONE", 1: "PIECEWISE", 2: "FULL"}
COMPILATION_MODES = ("NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE")
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc",
                   "fp8_ds_mla")
# CompilationConfig fields (the dataclass forbids others, so a typo fails like in vLLM).
COMPILATION_KEYS = frozenset({
    "mode", "level", "debug_dump_path", "cache_dir", "compile_cache_save_format", "backend",
    "custom_ops", "ir_enable_torch_wrap", "splitting_ops", "compile_mm_encoder",
    "cudagraph_mm_encoder", "compile_sizes", "compile_ranges_endpoints",
    "inductor_compile_config", "inductor_passes", "cudagraph_mode", "cudagraph_num_of_warmups",
    "cudagraph_capture_sizes", "cudagraph_copy_inputs", "cudagraph_specialize_lora",
    "use_inductor_graph_partition", "pass_config", "max_cudagraph_capture_size",
    "dynamic_shapes_config", "local_cache_dir", "fast_moe_cold_start", "static_all_moe_layers",
})

# kind per known flag: int, hint (human-readable int like 32k), float, str, bool, json, list_str,
# list_int; with the vLLM default used to decide what counts as "non-default".
FLAGS: dict[str, tuple[str, Any]] = {
    "host": ("str", None), "port": ("int", 8000), "model": ("str", "Qwen/Qwen3-0.6B"),
    "dtype": ("str", "auto"), "seed": ("int", 0), "max_model_len": ("hint", None),
    "quantization": ("str", None),
    "enforce_eager": ("bool", False), "served_model_name": ("list_str", None),
    "pipeline_parallel_size": ("int", 1), "tensor_parallel_size": ("int", 1),
    "disable_custom_all_reduce": ("bool", False), "gpu_memory_utilization": ("float", 0.9),
    "kv_cache_memory_bytes": ("hint", None), "kv_cache_dtype": ("str", "auto"),
    "enable_prefix_caching": ("bool", None), "max_num_batched_tokens": ("hint", None),
    "max_num_seqs": ("int", None), "disable_log_stats": ("bool", False),
    "speculative_config": ("json", None), "spec_method": ("str", None),
    "spec_model": ("str", None), "spec_tokens": ("int", None),
    "optimization_level": ("int", 2), "cudagraph_capture_sizes": ("list_int", None),
    "max_cudagraph_capture_size": ("int", None), "compilation_config": ("json", None),
    "load_format": ("str", "auto"),
}
ALIASES = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size",
           "cc": "compilation_config", "sc": "speculative_config", "O": "optimization_level"}
CHOICES = {"dtype": DTYPES, "kv_cache_dtype": KV_CACHE_DTYPES}
_OPT_NAMES = {"compilation_config": "--compilation-config/-cc",
              "speculative_config": "--speculative-config/-sc",
              "optimization_level": "--optimization-level/-O",
              "tensor_parallel_size": "--tensor-parallel-size/-tp",
              "pipeline_parallel_size": "--pipeline-parallel-size/-pp"}
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


class ArgvError(Exception):
    """Parsing failed: `text` is what vLLM would print (stderr), `exit_code` how it exits."""

    def __init__(self, text: str, exit_code: int) -> None:
        super().__init__(text)
        self.text = text
        self.exit_code = exit_code


@dataclass(frozen=True)
class SimArgs:
    values: dict[str, Any]                 # every known dest, defaults filled in
    given: dict[str, Any]                  # known dests present on the command line, in order
    unknown: dict[str, Any] = field(default_factory=dict)   # unknown flags, as given
    warnings: tuple[str, ...] = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError as exc:
            raise AttributeError(name) from exc


def _usage_error(dest_or_opt: str, message: str) -> ArgvError:
    opt = _OPT_NAMES.get(dest_or_opt, "--" + dest_or_opt.replace("_", "-"))
    return ArgvError(f"{USAGE}\n{PROG}: error: argument {opt}: {message}\n", 2)


def _validation_error(model: str, loc: str, msg: str, value: Any, kind: str) -> str:
    return (f"1 validation error for {model}\n{loc}\n  {msg} [type={kind}, "
            f"input_value={value!r}, input_type={type(value).__name__}]")


def cudagraph_keyerror(value: str) -> ArgvError:
    """vLLM passes the mode through CUDAGraphMode[value.upper()], so a bad name is a KeyError."""
    key = value.upper()
    text = (
        "Traceback (most recent call last):\n"
        '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        '  File "<frozen runpy>", line 88, in _run_code\n'
        '  File "site-packages/vllm/entrypoints/cli/main.py", line 75, in main\n'
        "    args = parser.parse_args()\n"
        '  File "site-packages/vllm/utils/argparse_utils.py", line 429, in parse_args\n'
        "    return super().parse_args(processed_args, namespace)\n"
        '  File "python3.12/argparse.py", line 2577, in _get_value\n'
        "    result = type_func(arg_string)\n"
        '  File "site-packages/vllm/engine/arg_utils.py", line 333, in parse_dataclass\n'
        "    return TypeAdapter(cls).validate_json(val)\n"
        '  File "site-packages/vllm/config/compilation.py", line 870, in '
        "validate_cudagraph_mode_before\n"
        "    return CUDAGraphMode[value.upper()]\n"
        "           ~~~~~~~~~~~~~^^^^^^^^^^^^^^^\n"
        '  File "python3.12/enum.py", line 814, in __getitem__\n'
        "    return cls._member_map_[name]\n"
        "           ~~~~~~~~~~~~~~~~^^^^^^\n"
        f"KeyError: {key!r}\n"
    )
    return ArgvError(text, 1)


def _dest(name: str) -> str:
    return name.replace("-", "_")


def _human_int(dest: str, raw: str) -> int:
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?)([kKmMgG]?)", raw.strip())
    if not m:
        raise _usage_error(dest, f"invalid human_readable_int value: {raw!r}")
    mult = {"": 1, "k": 1000, "m": 10**6, "g": 10**9, "K": 1024, "M": 2**20, "G": 2**30}
    return int(float(m.group(1)) * mult[m.group(2)])


def _convert(dest: str, kind: str, raw: Any) -> Any:
    if kind in ("int", "hint"):
        if kind == "hint":
            return _human_int(dest, raw)
        try:
            return int(raw)
        except ValueError:
            raise _usage_error(dest, f"invalid int value: {raw!r}") from None
    if kind == "float":
        try:
            return float(raw)
        except ValueError:
            raise _usage_error(dest, f"invalid float value: {raw!r}") from None
    if kind == "json":
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            if dest == "compilation_config":
                msg = _validation_error("CompilationConfig", "", f"Invalid JSON: {exc.msg} at "
                                        f"line {exc.lineno} column {exc.colno}", raw, "json_invalid")
                raise _usage_error(dest, msg) from None
            raise _usage_error(dest, f"invalid loads value: {raw!r}") from None
        if not isinstance(value, dict):
            raise _usage_error(dest, f"invalid loads value: {raw!r} (expected a JSON object)")
        return value
    if dest in CHOICES and raw not in CHOICES[dest]:
        choices = ", ".join(repr(c) for c in CHOICES[dest])
        raise _usage_error(dest, f"invalid choice: {raw!r} (choose from {choices})")
    return raw


def _dotted_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _set_nested(target: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for part in parts[:-1]:
        target = target.setdefault(part, {})
    target[parts[-1]] = value


def validate_compilation_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Check a merged -cc dict the way vLLM's CompilationConfig validators do."""
    for key in cfg:
        if key not in COMPILATION_KEYS:
            msg = _validation_error("CompilationConfig", key, "Extra inputs are not permitted",
                                    cfg[key], "extra_forbidden")
            raise _usage_error("compilation_config", msg)
    out = dict(cfg)
    if "level" in out:
        out.setdefault("mode", out.pop("level"))
    if "mode" in out and out["mode"] is not None:
        mode = out["mode"]
        valid = ", ".join(COMPILATION_MODES)
        if isinstance(mode, bool) or not isinstance(mode, (int, str)):
            ok = False
        elif isinstance(mode, int):
            ok = 0 <= mode <= 3
        else:
            ok = mode.upper() in COMPILATION_MODES or (mode.isdigit() and int(mode) <= 3)
        if not ok:
            msg = _validation_error("CompilationConfig", "mode", "Value error, Invalid "
                                    f"compilation mode: {mode}. Valid modes are: {valid}", mode,
                                    "value_error")
            raise _usage_error("compilation_config", msg)
        if isinstance(mode, str):
            out["mode"] = int(mode) if mode.isdigit() else COMPILATION_MODES.index(mode.upper())
    if "cudagraph_mode" in out and out["cudagraph_mode"] is not None:
        cg = out["cudagraph_mode"]
        if isinstance(cg, int) and not isinstance(cg, bool) and cg in CUDAGRAPH_MODE_BY_INT:
            out["cudagraph_mode"] = CUDAGRAPH_MODE_BY_INT[cg]
        elif isinstance(cg, str):
            if cg.upper() not in CUDAGRAPH_MODES:
                raise cudagraph_keyerror(cg)
            out["cudagraph_mode"] = cg.upper()
        else:
            msg = _validation_error("CompilationConfig", "cudagraph_mode", "Input should be "
                                    "'NONE', 'PIECEWISE', 'FULL', 'FULL_DECODE_ONLY' or "
                                    "'FULL_AND_PIECEWISE'", cg, "enum")
            raise _usage_error("compilation_config", msg)
    for key in ("cudagraph_capture_sizes", "compile_sizes"):
        val = out.get(key)
        if val is not None and not (isinstance(val, list)
                                    and all(isinstance(v, int) and v > 0 for v in val)):
            msg = _validation_error("CompilationConfig", key, "Input should be a valid list of "
                                    "positive integers", val, "list_type")
            raise _usage_error("compilation_config", msg)
    mcs = out.get("max_cudagraph_capture_size")
    if mcs is not None and (not isinstance(mcs, int) or isinstance(mcs, bool) or mcs < 0):
        msg = _validation_error("CompilationConfig", "max_cudagraph_capture_size",
                                "Input should be a valid integer", mcs, "int_type")
        raise _usage_error("compilation_config", msg)
    return out


def _split(token: str) -> tuple[str, str | None]:
    if "=" in token:
        name, value = token.split("=", 1)
        return name, value
    return token, None


class _Tokens:
    """The command line still to read. A flag takes the next token as its value unless that
    token looks like a flag (a negative number is a value, as with argparse)."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.i = 0

    def more(self) -> bool:
        return self.i < len(self.tokens)

    def pop(self) -> str:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def has_value(self) -> bool:
        if not self.more():
            return False
        tok = self.tokens[self.i]
        return not tok.startswith("-") or bool(_NUMBER.match(tok))

    def value(self, dest: str) -> str:
        """The next token as the one value of `dest` (vLLM's error when there is none)."""
        if not self.has_value():
            raise _usage_error(dest, "expected one argument")
        return self.pop()


@dataclass
class _Parsed:
    """What `parse_argv` has read so far."""

    given: dict[str, Any] = field(default_factory=dict)
    unknown: dict[str, Any] = field(default_factory=dict)
    seen: list[str] = field(default_factory=list)
    dupes: list[str] = field(default_factory=list)
    # -cc.key=value / -sc.key=value, merged over the JSON flag at the end
    dotted: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {"compilation_config": {}, "speculative_config": {}})


def parse_argv(argv: Sequence[str]) -> SimArgs:
    """Parse `[serve] [model_tag] --flag value ...` like `vllm serve`."""
    tokens = list(argv)
    if tokens and tokens[0] == "serve":
        tokens = tokens[1:]
    parsed = _Parsed()
    if tokens and not tokens[0].startswith("-"):
        parsed.given["model"] = tokens.pop(0)   # positional model_tag, as `vllm serve MODEL`
    rest = _Tokens(tokens)
    while rest.more():
        name, inline = _flag_name(rest.pop())
        # dotted config keys: -cc.cudagraph_mode=X, --compilation-config.cudagraph_mode X
        head, _, key = name.partition(".")
        head = ALIASES.get(head, _dest(head))
        if key and head in parsed.dotted:
            _read_dotted(parsed.dotted[head], head, key, inline, rest)
            continue
        negated = name.startswith("no_") and name[3:] in FLAGS and FLAGS[name[3:]][0] == "bool"
        if negated:
            name = name[3:]
        if name in FLAGS:
            _read_known(parsed, name, inline, negated, rest)
            continue
        # Unknown flag: keep it (vLLM has far more flags than the simulator models).
        if inline is None and rest.has_value():
            inline = rest.pop()
        parsed.unknown[name.removeprefix("_short_")] = True if inline is None else _dotted_value(inline)
    return _finish(parsed)


def _flag_name(tok: str) -> tuple[str, str | None]:
    """A flag token's destination and its inline (`=`) value. A short flag that is not an
    alias is kept as `_short_<name>` (an unknown flag, printed without the prefix)."""
    if not tok.startswith("-") or tok in ("-", "--"):
        raise ArgvError(f"{USAGE}\n{PROG}: error: unrecognized arguments: {tok}\n", 2)
    m = re.fullmatch(r"-O(\d+)", tok)
    if m:
        return "optimization_level", m.group(1)
    raw_name, inline = _split(tok.lstrip("-"))
    name = ALIASES.get(raw_name, _dest(raw_name))
    if not tok.startswith("--") and raw_name not in ALIASES and raw_name.split(".", 1)[0] not in ALIASES:
        name = "_short_" + raw_name
    return name, inline


def _read_dotted(target: dict[str, Any], head: str, key: str, inline: str | None, rest: _Tokens) -> None:
    """One `-cc.key value` / `-cc.key=value`; `key+=a,b` gives a list."""
    if inline is None:
        inline = rest.value(head)
    value: Any = _dotted_value(inline)
    if key.endswith("+"):
        key = key[:-1]
        value = [v for v in inline.split(",") if v]
    _set_nested(target, key, value)


def _read_known(parsed: _Parsed, name: str, inline: str | None, negated: bool, rest: _Tokens) -> None:
    """One flag the simulator knows (a FLAGS entry), with its value(s) by kind."""
    kind, _default = FLAGS[name]
    if name in parsed.seen:
        parsed.dupes.append("--" + name.replace("_", "-"))
    parsed.seen.append(name)
    if kind == "bool":
        if inline is not None:
            raise _usage_error(name, f"ignored explicit argument {inline!r}")
        parsed.given[name] = not negated
    elif kind in ("list_str", "list_int"):
        parsed.given[name] = _list_value(name, kind, inline, rest)
    else:
        _set_value(parsed.given, name, kind, rest.value(name) if inline is None else inline)


def _list_value(name: str, kind: str, inline: str | None, rest: _Tokens) -> list[Any]:
    """A list flag's values: the inline one and every following token that is not a flag."""
    items: list[Any] = [inline] if inline is not None else []
    while rest.has_value():
        items.append(rest.pop())
    if not items:
        raise _usage_error(name, "expected at least one argument")
    if kind == "list_int":
        items = [_convert(name, "int", v) for v in items]
    return items


def _set_value(given: dict[str, Any], name: str, kind: str, raw: str) -> None:
    """A one-value flag; repeated JSON config flags merge (later keys win)."""
    if name in ("compilation_config", "speculative_config"):
        merged = dict(given.get(name) or {})
        merged.update(_convert(name, kind, raw))
        given[name] = merged
    elif name == "optimization_level" and not re.fullmatch(r"\d+", raw):
        msg = _validation_error("VllmConfig", "optimization_level", "Input should be"
                                " a valid integer, unable to parse string as an "
                                "integer", raw, "int_parsing")
        raise _usage_error(name, msg)
    else:
        given[name] = _convert(name, kind, raw)


def _finish(parsed: _Parsed) -> SimArgs:
    """Merge the dotted keys, run the checks vLLM runs on the whole config, fill in defaults."""
    given = parsed.given
    for head, extra in parsed.dotted.items():
        if extra:
            merged = dict(given.get(head) or {})
            merged.update(extra)
            given[head] = merged
    if "compilation_config" in given:
        given["compilation_config"] = validate_compilation_config(given["compilation_config"])
    level = given.get("optimization_level")
    if level is not None and not 0 <= level <= 3:
        msg = _validation_error("VllmConfig", "optimization_level", "Input should be less than "
                                "or equal to 3", level, "less_than_equal")
        raise _usage_error("optimization_level", msg)
    values = {dest: default for dest, (_kind, default) in FLAGS.items()}
    values.update(given)
    dupes = parsed.dupes
    warnings = (f"Found duplicate keys {', '.join(dict.fromkeys(dupes))}",) if dupes else ()
    return SimArgs(values=values, given=given, unknown=parsed.unknown, warnings=warnings)


# vLLM prints vars(args) in parser order: frontend flags first, then EngineArgs groups.
NON_DEFAULT_ORDER = (
    "model_tag", "host", "port", "model", "dtype", "seed", "max_model_len", "quantization", "enforce_eager",
    "served_model_name", "pipeline_parallel_size", "tensor_parallel_size",
    "disable_custom_all_reduce", "gpu_memory_utilization", "kv_cache_memory_bytes",
    "kv_cache_dtype", "enable_prefix_caching", "max_num_batched_tokens", "max_num_seqs",
    "disable_log_stats", "speculative_config", "spec_method", "spec_model", "spec_tokens",
    "optimization_level", "cudagraph_capture_sizes", "max_cudagraph_capture_size",
    "compilation_config",
)


def non_default_args(args: SimArgs) -> dict[str, Any]:
    """The `non-default args` dict vLLM logs: known args that differ from vLLM's default,
    in parser order, then unknown flags in the order given."""
    out: dict[str, Any] = {}
    for dest in NON_DEFAULT_ORDER:
        if dest in args.given and args.given[dest] != FLAGS[dest][1]:
            out[dest] = args.given[dest]
    out.update(args.unknown)
    return out
