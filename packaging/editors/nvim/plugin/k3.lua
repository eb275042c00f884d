-- :K3 (whole buffer or a range) and :K3Cancel; see lua/k3.lua.
vim.api.nvim_create_user_command("K3", function(opts)
  require("k3").send_lines(opts.line1, opts.line2)
end, { range = "%", desc = "k3: send the buffer or the selected lines to k3d" })

vim.api.nvim_create_user_command("K3Cancel", function()
  require("k3").cancel()
end, { desc = "k3: cancel the reply in progress" })
