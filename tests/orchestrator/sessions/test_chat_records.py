"""orchestrator/sessions/chat_records.py: turns and the transcript, pure."""

from __future__ import annotations

from orchestrator.sessions.chat_records import (
    append_records,
    NewMessage,
    Role,
    ToolCallSummary,
    decode_messages,
    decode_transcript,
    encode_messages,
    encode_transcript,
    split_turns,
    stamp,
    transcript_of,
)


def conversation() -> list:
    new = [
        NewMessage(Role.ASSISTANT, "hello, how can I help?"),
        NewMessage(Role.USER, "list files", speaker_user_id=67),
        NewMessage(Role.ASSISTANT, "", tool_calls=(ToolCallSummary("list_dir", "ok"),)),
        NewMessage(Role.TOOL, "a.txt\nb.txt"),
        NewMessage(Role.ASSISTANT, "two files"),
        NewMessage(Role.USER, "thanks"),
        NewMessage(Role.USER, "one more"),
        NewMessage(Role.ASSISTANT, "sure"),
    ]
    return stamp(new, next_seq=1, at="2026-01-01T00:00:00+00:00")


def test_a_turn_starts_at_every_user_message() -> None:
    turns = split_turns(conversation())
    assert [t.number for t in turns] == [1, 2, 3, 4]
    assert [[m.seq for m in t.messages] for t in turns] == [[1], [2, 3, 4, 5], [6], [7, 8]]


def test_the_transcript_keeps_the_last_turns_without_tool_results() -> None:
    turns = transcript_of(conversation(), 2)
    assert [t.number for t in turns] == [3, 4]
    full = transcript_of(conversation(), 10)
    second = full[1]
    assert [m.role for m in second.messages] == [Role.USER, Role.ASSISTANT, Role.ASSISTANT]
    assert second.messages[1].tool_calls == (ToolCallSummary("list_dir", "ok"),)


def test_records_round_trip() -> None:
    messages = conversation()
    assert decode_messages(encode_messages("s", messages)) == messages
    turns = transcript_of(messages, 3)
    assert decode_transcript(encode_transcript("s", turns, 3)) == turns
    assert stamp([NewMessage(Role.USER, "x")], next_seq=9, at="t")[0].seq == 9


def test_append_records_numbers_turns_from_the_start_and_keeps_the_tail() -> None:
    records = append_records("s", None, [NewMessage(Role.USER, f"q{i}") for i in range(5)], at="t", turns_kept=2)
    assert (records.appended, records.message_count, records.last_seq, records.transcript_turns) == (5, 5, 5, 2)
    more = append_records(
        "s", records.messages_json, [NewMessage(Role.ASSISTANT, "a"), NewMessage(Role.USER, "q5")], at="t2", turns_kept=2
    )
    assert [m.seq for m in decode_messages(more.messages_json)] == list(range(1, 8))
    turns = decode_transcript(more.transcript_json)
    assert [(t.number, [m.content for m in t.messages]) for t in turns] == [(5, ["q4", "a"]), (6, ["q5"])]
    assert turns == transcript_of(decode_messages(more.messages_json), 2)
