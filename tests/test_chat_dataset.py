"""The support-chat dataset of the prefix-caching example studies: the committed file is what
scripts/make_chat_dataset.py writes, and it has the shape the studies rely on (multi-turn
conversations whose long system prompts are shared within a product)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT
from tuner.load.dataset import parse_dataset

DATA = ROOT / "search_spaces" / "data" / "support-chat.jsonl"


def test_the_committed_file_is_the_generators_output() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_chat_dataset.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "matches the generator" in out.stdout


def test_conversations_share_long_system_prompts_and_have_three_user_turns() -> None:
    data = parse_dataset(DATA.read_text(encoding="utf-8"), "auto", source=str(DATA))
    assert data.format == "openai-chat" and data.detected and len(data) == 48
    systems: dict[str, int] = {}
    for chat in data.conversations:
        roles = [m.role for m in chat.messages]
        assert roles == ["system", "user", "assistant", "user", "assistant", "user"], roles
        assert chat.output_tokens is None              # the study's dataset.output_tokens applies
        systems[chat.messages[0].content] = systems.get(chat.messages[0].content, 0) + 1
    # Four products, twelve conversations each; a system prompt is hundreds of words, the
    # questions a dozen: most of every prompt is a prefix another conversation sent before.
    assert sorted(systems.values()) == [12, 12, 12, 12]
    assert min(len(s.split()) for s in systems) > 500
    assert max(len(m.content.split()) for c in data.conversations for m in c.messages[1:]) < 20
