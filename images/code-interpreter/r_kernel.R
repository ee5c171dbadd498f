# The R side of kernel.py: one process per context, its cells evaluated in one global
# environment for the process's life. A cell comes as a line: its code in hex, then its variables
# as `name:value` pairs in hex, comma-separated (base R reads no JSON, and hex needs no escaping).
# The answer is E2B's NDJSON messages on stdout, then {"type": "end_of_cell"}. A cell's value is
# its last visible expression's, printed as R prints it (`[1] "x"`, as IRkernel's text/plain).
con <- file("stdin", open = "rb")
out <- stdout()

unhex <- function(h) {
  if (!nzchar(h)) return("")
  bytes <- as.raw(strtoi(substring(h, seq(1, nchar(h), 2), seq(2, nchar(h), 2)), 16L))
  s <- rawToChar(bytes)
  Encoding(s) <- "UTF-8"
  s
}

json_string <- function(s) {
  s <- enc2utf8(paste(s, collapse = "\n"))
  s <- gsub("\\", "\\\\", s, fixed = TRUE)
  s <- gsub("\"", "\\\"", s, fixed = TRUE)
  s <- gsub("\n", "\\n", s, fixed = TRUE)
  s <- gsub("\r", "\\r", s, fixed = TRUE)
  s <- gsub("\t", "\\t", s, fixed = TRUE)
  s <- gsub("[\001-\037]", "", s, useBytes = TRUE)
  paste0("\"", s, "\"")
}

emit <- function(type, ..., main = NULL) {
  fields <- list(...)
  parts <- c(sprintf("\"type\":%s", json_string(type)))
  if (length(fields)) parts <- c(parts, sprintf("\"%s\":%s", names(fields), vapply(fields, json_string, "")))
  if (!is.null(main)) parts <- c(parts, sprintf("\"is_main_result\":%s", if (main) "true" else "false"))
  cat(paste0("{", paste(parts, collapse = ","), "}\n"), file = out)
  flush(out)
}

# The cell's own variables for its run, put back as they were after it.
with_env <- function(vars, body) {
  if (length(vars)) {
    before <- Sys.getenv(names(vars), unset = NA, names = TRUE)
    do.call(Sys.setenv, as.list(vars))
    on.exit({
      set <- before[!is.na(before)]
      if (length(set)) do.call(Sys.setenv, as.list(set))
      if (any(is.na(before))) Sys.unsetenv(names(before)[is.na(before)])
    })
  }
  body
}

run_cell <- function(code) {
  exprs <- tryCatch(parse(text = code, keep.source = FALSE), error = function(e) {
    emit("error", name = "SyntaxError", value = conditionMessage(e), traceback = conditionMessage(e))
    NULL
  })
  if (is.null(exprs)) return(invisible())
  n <- length(exprs)
  for (i in seq_len(n)) {
    ok <- withCallingHandlers(
      tryCatch({
        r <- NULL
        printed <- capture.output(r <- withVisible(eval(exprs[[i]], envir = .GlobalEnv)))
        if (length(printed)) emit("stdout", text = paste0(paste(printed, collapse = "\n"), "\n"))
        if (r$visible) {
          shown <- paste(capture.output(print(r$value)), collapse = "\n")
          if (i == n) emit("result", text = shown, main = TRUE) else emit("stdout", text = paste0(shown, "\n"))
        }
        TRUE
      },
      error = function(e) {
        emit("error", name = "RError", value = conditionMessage(e), traceback = paste0("Error: ", conditionMessage(e)))
        FALSE
      },
      interrupt = function(e) {
        emit("error", name = "KeyboardInterrupt", value = "interrupted", traceback = "the cell was interrupted")
        FALSE
      }),
      warning = function(w) {
        emit("stderr", text = paste0("Warning message:\n", conditionMessage(w), "\n"))
        invokeRestart("muffleWarning")
      },
      message = function(m) {
        emit("stderr", text = conditionMessage(m))
        invokeRestart("muffleMessage")
      }
    )
    if (!ok) break
  }
  invisible()
}

repeat {
  line <- readLines(con, n = 1, warn = FALSE)
  if (!length(line)) break
  fields <- strsplit(line, " ", fixed = TRUE)[[1]]
  code <- unhex(if (length(fields)) fields[[1]] else "")
  vars <- character()
  if (length(fields) > 1 && nzchar(fields[[2]])) {
    for (pair in strsplit(fields[[2]], ",", fixed = TRUE)[[1]]) {
      kv <- strsplit(pair, ":", fixed = TRUE)[[1]]
      vars[[unhex(kv[[1]])]] <- if (length(kv) > 1) unhex(kv[[2]]) else ""
    }
  }
  tryCatch(with_env(vars, run_cell(code)), interrupt = function(e) NULL)
  emit("end_of_cell")
}
