"""The summarizer's timeout bounds the whole model call. It was urllib's timeout, which bounds
each socket operation: an endpoint answering a byte at a time held the call (and one of the four
summarizer slots) for as long as it liked. A real HTTP endpoint on loopback."""

from __future__ import annotations

import asyncio

import pytest

from sessions_server.integrations.chat_completions import ChatCompletionsSummarizer, SummarizerError
from tests.service.chat_completions_stub import DRIP, DRIP_PAUSE, ChatCompletionsStub


def test_an_endpoint_answering_a_byte_at_a_time_runs_out_of_time(llm: ChatCompletionsStub) -> None:
    llm.mode = DRIP  # every byte comes well within a socket timeout; the answer takes seconds
    summarizer = ChatCompletionsSummarizer(llm.url, "model", timeout_seconds=DRIP_PAUSE * 5)

    with pytest.raises(SummarizerError, match=r"timed out: no answer within 0\.5 s"):
        asyncio.run(summarizer.summarize("prompt"))
    assert len(llm.requests) == 1


def test_an_endpoint_answering_in_time_is_heard(llm: ChatCompletionsStub) -> None:
    summarizer = ChatCompletionsSummarizer(llm.url, "model", timeout_seconds=30)

    assert asyncio.run(summarizer.summarize("prompt")) == "summary #1"
