-- Drives the k3.nvim plugin headless against a real daemon (started by tests/e2e_http.rs):
-- sends a buffer holding $K3_PROMPT, waits for the streamed reply, writes it to $K3_OUT; then
-- asks again for a long reply, cancels it once text arrives and writes how it ended to
-- $K3_OUT.cancel.
local out = os.getenv("K3_OUT")
local k3 = require("k3")
k3.setup({ socket = os.getenv("K3_HTTP_SOCKET"), max_tokens = 12 })

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

local function finish(ok, message)
  if not ok then
    write(out .. ".error", message)
  end
  vim.cmd("qall!")
end

local ok, err = pcall(function()
  vim.api.nvim_buf_set_lines(0, 0, -1, false, { os.getenv("K3_PROMPT") })
  vim.cmd("%K3")
  assert(vim.wait(60000, function() return k3.state.done end, 10), "no reply within 60 s")
  assert(not k3.state.error, tostring(k3.state.error))
  local reply = vim.api.nvim_buf_get_lines(k3.state.buf, 0, -1, false)
  write(out, table.concat(reply, "\n"))

  k3.setup({ max_tokens = 4000 })
  vim.cmd("wincmd p")
  vim.cmd("1K3")
  local buf = k3.state.buf
  assert(vim.wait(60000, function()
    local lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
    return #lines > 1 or #lines[1] > 0
  end, 5), "no text within 60 s")
  vim.cmd("K3Cancel")
  assert(vim.wait(5000, function() return k3.state.done end, 5), "the cancelled job did not end")
  write(out .. ".cancel", k3.state.cancelled and "cancelled" or "not cancelled")
end)
finish(ok, tostring(err))
