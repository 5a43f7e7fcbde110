"""What the engine plugins share: their configuration (:mod:`.config`), the table
of hook points with the engine versions it was checked against (:mod:`.hookpoints`),
the patching of those points (:mod:`.patching`), the
drift refusals by field (:mod:`.drift`) and the session set-up, the pinned KV budget
and the reports of a serving process (:mod:`.session`)."""
