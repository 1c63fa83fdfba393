// The console's entry point: pick the page the server named.

import { runPage } from "./run.js";
import { runnersPage } from "./runners.js";
import { blockedPage, runsPage } from "./runs.js";

const page = document.body.dataset.page;
const main = document.getElementById("main");

for (const link of document.querySelectorAll("[data-nav]")) {
  if (link.dataset.nav === page || (page === "run" && link.dataset.nav === "runs")) link.classList.add("current");
}

if (page === "run") runPage(main, document.body.dataset.run);
else if (page === "runners") runnersPage(main);
else if (page === "blocked") blockedPage(main);
else runsPage(main);
