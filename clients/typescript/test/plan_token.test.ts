// Plan tokens, against a real server: addCompaction with `planToken` stores a summary only if
// what it is made of is as planned, and compact(summarize) passes its plan's token, planning and
// summarizing again (three tries in all) when the summary is refused.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { SessionsError, pb, type CompactionPlan, type SessionHandle, type SessionsClient } from "../src/index.js";
import { TestServer, freshKey, msg } from "./server.js";

let server: TestServer;
let client: SessionsClient;

before(async () => {
  server = await TestServer.start();
  client = server.client();
});
after(async () => {
  await server?.stop();
});

function expectFailure(code: string, reason: string | null) {
  return (e: unknown) => {
    assert.ok(e instanceof SessionsError, `expected SessionsError, got ${String(e)}`);
    assert.equal(e.code, code, e.message);
    assert.equal(e.reason, reason, e.message);
    return true;
  };
}

/** The turn `id` (m00 to m11) with new text, its role kept. */
function editedTurn(id: string, text: string) {
  return msg(id, text, Number(id.slice(1)) % 2 === 0 ? "user" : "assistant");
}

/**
 * Appends twelve alternating turns of about 3 KB each, m00 to m11, and plans with a one-token
 * tail; the span must hold m05 and end before m10, so m05 is inside it and m11 is not beside it.
 */
async function planTurns(s: SessionHandle): Promise<CompactionPlan> {
  await s.appendMessages(
    Array.from({ length: 12 }, (_, i) =>
      msg(`m${String(i).padStart(2, "0")}`, `turn ${i} words `.repeat(200), i % 2 === 0 ? "user" : "assistant"),
    ),
  );
  const plan = await s.planCompaction({ keepRecentTokens: 1 });
  assert.ok(plan !== null);
  assert.equal(typeof plan.planToken, "string");
  assert.notEqual(plan.planToken, "", "the plan has a token");
  assert.ok(
    plan.fromMessageId <= "m05" && plan.toMessageId >= "m05" && plan.toMessageId < "m10",
    `plan ${plan.fromMessageId}..${plan.toMessageId}: want a span holding m05 and ending before m10`,
  );
  return plan;
}

describe("plan tokens", () => {
  test("the reasons are in the contract's ErrorReason enum", () => {
    assert.equal(pb.ErrorReason[pb.ErrorReason.SESSION_CHANGED], "SESSION_CHANGED");
    assert.equal(pb.ErrorReason[pb.ErrorReason.PLAN_EXPIRED], "PLAN_EXPIRED");
  });

  test("addCompaction with the token is refused SESSION_CHANGED after an edit inside the span", async () => {
    const s = client.object(freshKey("plan-token-edited")).session("s");
    const plan = await planTurns(s);
    assert.ok((await s.updateMessage(editedTurn("m05", "edited after the plan"))) !== null);
    await assert.rejects(
      s.addCompaction("stale summary", plan.fromMessageId, plan.toMessageId, { planToken: plan.planToken }),
      expectFailure("FAILED_PRECONDITION", "SESSION_CHANGED"),
    );
    assert.deepEqual(await s.listCompactions(), []);
  });

  test("an edit outside the span keeps the summary; the token is used once (PLAN_EXPIRED)", async () => {
    const s = client.object(freshKey("plan-token-once")).session("s");
    const plan = await planTurns(s);
    assert.ok((await s.updateMessage(editedTurn("m11", "the newest, edited"))) !== null);
    const record = await s.addCompaction("the summary", plan.fromMessageId, plan.toMessageId, { planToken: plan.planToken });
    assert.equal(record.summary, "the summary");
    assert.equal(record.fromMessageId, plan.fromMessageId);
    assert.equal(record.toMessageId, plan.toMessageId);
    await assert.rejects(
      s.addCompaction("again", plan.fromMessageId, plan.toMessageId, { planToken: plan.planToken }),
      expectFailure("FAILED_PRECONDITION", "PLAN_EXPIRED"),
    );
    assert.deepEqual(await s.listCompactions(), [record]);
  });

  test("compact(summarize) plans and summarizes again after an edit while it summarized", async () => {
    const s = client.object(freshKey("plan-token-again")).session("s");
    await planTurns(s);
    let calls = 0;
    const record = await s.compact(
      async () => {
        calls += 1;
        if (calls === 1) await s.updateMessage(editedTurn("m05", "edited while summarizing"));
        return `summary ${calls}`;
      },
      { keepRecentTokens: 1 },
    );
    assert.equal(calls, 2, "summarized twice");
    assert.ok(record !== null);
    assert.equal(record.summary, "summary 2");
    assert.deepEqual(await s.listCompactions(), [record]);
  });

  test("compact(summarize) throws SESSION_CHANGED after three tries all outrun, storing nothing", async () => {
    const s = client.object(freshKey("plan-token-outrun")).session("s");
    await planTurns(s);
    let calls = 0;
    await assert.rejects(
      s.compact(
        async () => {
          calls += 1;
          await s.updateMessage(editedTurn("m05", `edit ${calls}`));
          return `summary ${calls}`;
        },
        { keepRecentTokens: 1 },
      ),
      expectFailure("FAILED_PRECONDITION", "SESSION_CHANGED"),
    );
    assert.equal(calls, 3, "summarized three times");
    assert.deepEqual(await s.listCompactions(), []);
  });
});
