-- Settings of a connection that loads runs. Views sort what they return, so inserts may reorder
-- rows, which makes large loads markedly faster.
SET preserve_insertion_order = false;
