// End-to-end test of belfry's web view in headless Chromium (Debian's
// /usr/bin/chromium, driven by playwright-core; no browser download).
//
//   node ui-tests/e2e.mjs http://127.0.0.1:PORT [screenshot-dir]
//
// The Rust test tests/tests/ui_browser.rs starts a real scheduler replica
// (API + web view) and a worker, prepares the data named below, and runs
// this script; a non-zero exit fails that test.
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { chromium } from "playwright-core";

const base = process.argv[2];
const shots = process.argv[3];
if (!base) {
  console.error("usage: node ui-tests/e2e.mjs BASE_URL [SCREENSHOT_DIR]");
  process.exit(2);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const page = await browser.newPage({ viewport: { width: 1360, height: 900 } });
const step = (what) => console.log(`e2e: ${what}`);
const snap = async (name) => { if (shots) await page.screenshot({ path: `${shots}/${name}.png`, fullPage: true }); };

try {
  step("overview");
  await page.goto(`${base}/ui`);
  assert.equal(await page.locator("h1").textContent(), "Overview");

  step("a schedule fires and its strip turns green");
  await page.goto(`${base}/ui/schedules`);
  // The page refreshes itself every 5 s; wait for a succeeded fire.
  await page.locator('tr:has(a:text-is("e2e-tick")) .strip span.s-succeeded').first()
    .waitFor({ timeout: 30000 });
  await snap("schedules");
  await page.goto(`${base}/ui`);
  await snap("overview");

  step("pause from the schedule's page: no more fires");
  await page.goto(`${base}/ui/schedules/e2e-tick`);
  await page.locator('form[action$="/pause"] button').click();
  await page.locator(".flash").waitFor();
  assert.match(await page.locator(".flash").textContent(), /paused/);
  // A fire already in flight at the pause may still land: settle first.
  await page.waitForTimeout(1500);
  await page.reload();
  const before = await page.locator("tbody tr td:first-child a").count();
  const newest = await page.locator("tbody tr td:first-child a").first().textContent();
  await page.waitForTimeout(3000);
  await page.reload();
  assert.equal(await page.locator("tbody tr td:first-child a").first().textContent(), newest,
    "a paused schedule fired");
  assert.equal(await page.locator("tbody tr td:first-child a").count(), before);

  step("trigger now");
  await page.locator('form[action$="/trigger"] button').click();
  await page.locator(".flash").waitFor();
  assert.match(await page.locator(".flash").textContent(), /triggered: run e2e-tick@manual-/);
  await snap("schedule");

  step("open a failed run and read its error");
  await page.goto(`${base}/ui/runs?status=failed`);
  await snap("runs");
  await page.locator('a:text-matches("e2e-fail@")').first().click();
  await page.locator("h2:text-is('Attempts')").waitFor();
  const error = await page.locator("table").first().locator("tr:has(th:text-is('last error')) pre").textContent();
  assert.equal(error, "boom: <b>not bold</b>");
  await snap("run");

  step("a running run's log tails live, with its progress bar");
  // E2E_LOG_RUN: a run whose handler logs, then waits for the file
  // E2E_LOG_GATE before its last line (tests/tests/e2e/ui_browser.rs).
  await page.goto(`${base}/ui/runs/${process.env.E2E_LOG_RUN}`);
  await page.locator('#run-log span:text-matches("first line")').waitFor({ timeout: 30000 });
  // The page's 5 s refresh redraws <main> but keeps the panel it tails: a
  // mark on the heading goes, the mark on the panel stays.
  await page.evaluate(() => {
    document.querySelector("main h1").dataset.mark = "before the refresh";
    document.getElementById("log-panel").dataset.mark = "kept";
  });
  await page.waitForFunction(() => !document.querySelector("main h1").dataset.mark, null, { timeout: 20000 });
  assert.equal(await page.evaluate(() => document.getElementById("log-panel").dataset.mark), "kept",
    "the page's refresh redrew the log panel it was tailing");
  writeFileSync(process.env.E2E_LOG_GATE, "open");
  // Brought by the stream to this page (not by a reload or a refresh).
  await page.waitForFunction(() => (window.__belfry_tailed || []).includes("line after the gate"),
    null, { timeout: 20000 });
  await page.locator('#run-log span:text-matches("line after the gate")').waitFor();
  const bar = await page.locator("p.progress progress").evaluate((b) => [b.value, b.max]);
  assert.deepEqual(bar, [2, 2], "the progress bar shows the last report");
  await snap("run-log");

  step("a schedule name with <script> renders as text");
  await page.goto(`${base}/ui/schedules`);
  const content = await page.locator("main").textContent();
  assert.ok(content.includes("<script>window.__belfry_xss = 1</script>"), "the name is shown as text");
  assert.equal(await page.evaluate(() => window.__belfry_xss), undefined, "the name ran as a script");

  step("ok");
} finally {
  await browser.close();
}
