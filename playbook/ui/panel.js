// The live panel of a playbook run, as one anywidget module: it renders wherever anywidget does
// (JupyterLab, Notebook 7, VS Code, Colab, marimo).  The kernel sends HTML it has escaped; this
// module puts each part in its place and turns a click into a message naming the button.
const BUTTONS = {
  stop: ["Stop", "Stop the run: rows not finished are skipped"],
  retry_parked: ["Retry parked", "Run the parked rows again, with a fresh wait budget"],
  retry_failed: ["Retry failed", "Run the failed rows again"],
};
const PARTS = ["status", "pictures", "tables", "summary"];

function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "playbook-live";
  const row = document.createElement("div");
  row.className = "playbook-buttons";
  root.append(row);
  const parts = {};
  for (const name of PARTS) {
    parts[name] = document.createElement("div");
    parts[name].className = `playbook-${name}`;
    parts[name].innerHTML = model.get(name);
    root.append(parts[name]);
  }
  const drawButtons = () => {
    const disabled = new Set(model.get("disabled"));
    row.replaceChildren(
      ...model.get("buttons").map((name) => {
        const [label, tip] = BUTTONS[name] ?? [name, ""];
        const button = document.createElement("button");
        button.type = "button";
        button.className = "playbook-button";
        button.dataset.press = name;
        button.textContent = label;
        button.title = tip;
        button.disabled = disabled.has(name);
        button.addEventListener("click", () => model.send({ press: name }));
        return button;
      }),
    );
    row.hidden = row.childElementCount === 0;
  };
  drawButtons();
  const handlers = [
    ["change:buttons", drawButtons],
    ["change:disabled", drawButtons],
    ...PARTS.map((name) => [`change:${name}`, () => (parts[name].innerHTML = model.get(name))]),
  ];
  for (const [event, handler] of handlers) model.on(event, handler);
  el.append(root);
  return () => {
    for (const [event, handler] of handlers) model.off(event, handler);
  };
}

export default { render };
