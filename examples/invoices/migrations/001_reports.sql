CREATE TABLE billing_reports (month TEXT NOT NULL, customers INTEGER NOT NULL);
